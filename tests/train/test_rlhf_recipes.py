"""The RLHF recipes run as the chain they are: pairs sampled from a translation run on the real
Multi30k, then a reward model, PPO and DPO on those pairs, a few steps each, a tiny run
standing in for the supervised model."""

import json

from attnkit import recipes
from attnkit.cli import main
from attnkit.data.preference import read_pairs
from attnkit.run import RunFolder, load_pretrained
from attnkit.train.ppo_task import VALUE_HEAD_FILE
from attnkit.train.reward_model import load_reward_model
from tests.helpers import RLHF_RECIPES, tiny_run


def sets(overrides) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def train(recipe: str, *overrides: str) -> int:
    return main(["train", recipe, *sets(overrides)])


def test_the_rlhf_recipes_run_one_after_another(data_dir, tmp_path, capsys):
    assert set(RLHF_RECIPES) <= set(recipes.names())
    base = tiny_run(tmp_path / "base", "encoder-decoder", max_len=256)  # German in characters
    pairs, rm = tmp_path / "pairs", tmp_path / "rm"
    common = [f"train.init_from={base}", "train.threads=1"]
    # chrF tells a tiny untrained model's samples apart, where BLEU gives them all 0.
    sampled = [
        "pairs.max_sources=12",
        "pairs.reward=chrf",
        "pairs.min_gap=0",
        "pairs.max_new_tokens=12",
    ]
    assert (
        train(
            "multi30k_de_en_pairs",
            *common,
            *sampled,
            f"data.data_dir={data_dir}",
            f"train.out_dir={pairs}",
        )
        == 0
    )
    kept = read_pairs(pairs / "train.jsonl")
    assert 0 < len(kept) <= 12 and read_pairs(pairs / "val.jsonl")
    again = [*common, *sampled, f"data.data_dir={data_dir}", f"train.out_dir={pairs}"]
    assert train("multi30k_de_en_pairs", *again) == 2  # refused: it holds pairs
    assert "holds the pairs of an earlier run" in capsys.readouterr().err
    assert main(["train", "multi30k_de_en_pairs", "--overwrite", *sets(again)]) == 0
    records = [json.loads(line) for line in (pairs / "metrics.jsonl").open()]
    assert [r["split"] for r in records] == ["train", "val"]
    assert all(r["chosen_chrf"] > r["rejected_chrf"] for r in records)
    short = ["train.steps=2", "eval.every=2", "train.save_every=2", "data.max_tokens=400"]
    corpus = f"data.corpus={pairs}"
    assert train("multi30k_de_en_reward_model", *common, *short, corpus, f"train.out_dir={rm}") == 0
    assert load_reward_model(rm).config.shape == "encoder-decoder"
    ppo = tmp_path / "ppo"
    options = ["train.steps=2", "eval.every=2", "data.batch_size=4", "eval.decode_examples=4"]
    assert (
        train(
            "multi30k_de_en_ppo",
            *common,
            *options,
            corpus,
            f"ppo.reward_model={rm}",
            f"train.out_dir={ppo}",
        )
        == 0
    )
    assert (ppo / VALUE_HEAD_FILE).is_file() and load_pretrained(ppo)
    again = [*common, *options, corpus, f"ppo.reward_model={rm}", f"train.out_dir={ppo}"]
    assert main(["train", "multi30k_de_en_ppo", "--overwrite", *sets(again)]) == 0
    assert "val_reward" in RunFolder(ppo).read_metrics()[-1]
    dpo = tmp_path / "dpo"
    assert train("multi30k_de_en_dpo", *common, *short, corpus, f"train.out_dir={dpo}") == 0
    assert "reward_accuracy" in RunFolder(dpo).read_metrics()[-1]
