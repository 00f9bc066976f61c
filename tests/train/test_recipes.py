"""Every packaged recipe still runs: a few steps of its own model on the real corpus."""

import json
from pathlib import Path

import pytest
import torch

from attnkit import recipes
from attnkit.cli import main
from attnkit.models import build_model
from attnkit.train.run_config import RunConfig
from tests.helpers import RLHF_RECIPES, tiny_run

# demo: test_demo.py; the RLHF chain, each reading the one before: test_rlhf_recipes.py
RECIPES = [recipes.path(n) for n in recipes.names() if n != "demo" and n not in RLHF_RECIPES]


def test_the_recipes_are_all_here():
    assert {p.stem for p in RECIPES} >= {
        "multi30k_de_en",
        "multi30k_de_en_words",
        "multi30k_en_de",
        "tinyshakespeare_char",
        "cmudict_g2p",
        "word2vec",
        "glove",
    }


def test_no_recipe_names_a_data_folder_of_this_repository():
    """A user's clone has no ../shared/data: the recipes find their corpora in $ATTNKIT_DATA,
    the cache or a download, and a user points them elsewhere with --set data.data_dir."""
    assert [p.stem for p in RECIPES if RunConfig.load(p).data.data_dir] == []
    assert not [p.stem for p in RECIPES if "shared/data" in p.read_text()]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_trains_and_evaluates(recipe: Path, data_dir: Path, tmp_path: Path) -> None:
    config = RunConfig.load(recipe)
    overrides = [
        f"train.out_dir={tmp_path / 'run'}",
        f"data.data_dir={data_dir}",
        "train.steps=2",
        "train.save_every=2",
        "train.threads=1",
        "eval.every=2",
        "eval.max_batches=2",
        "eval.decode_examples=4",
    ]
    if config.data.task == "translation":
        overrides.append("data.max_tokens=600")  # small batches: a smoke test, not a run
    if config.data.task in ("word2vec", "glove"):  # no steps to cap: one epoch of the real text
        overrides.append(f"{config.data.task}.epochs=1")
    if config.train.device == "cuda" and not torch.cuda.is_available():
        # A GPU recipe on a machine without one: its model, data and loop, plainly, on the CPU.
        overrides += ["train.device=cpu", "train.compile=false", "train.precision=fp32"]
        overrides.append("data.batch_size=4")
    if config.train.init_from:  # a fine-tuning recipe: a tiny run stands in for its base
        base = tiny_run(tmp_path / "base", "encoder-decoder")
        overrides.append(f"train.init_from={base}")
    assert main(["train", str(recipe), *(a for o in overrides for a in ("--set", o))]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    if config.data.task in ("word2vec", "glove"):
        assert records[-1]["wordsim353_coverage"] > 0.2 and records[0]["epoch"] == 1
        assert (tmp_path / "run" / "vectors.bin").is_file()
        return
    assert records[-1]["step"] == 2
    assert config.eval.metric in records[-1]
    assert (tmp_path / "run" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("modern", "gpt"),
    [
        ("tinyshakespeare_modern", "tinyshakespeare_char"),
        ("tinyshakespeare_modern_gpu", "tinyshakespeare_char_gpu"),
    ],
)
def test_the_modern_recipes_keep_nanogpts_budget_and_change_the_blocks(modern, gpt):
    """Each modern recipe is compared with nanoGPT's at the same budget: same steps, batch,
    context and width, about the same parameters; only the architecture and its tuning differ."""
    new, old = RunConfig.load(modern), RunConfig.load(gpt)
    for section, keys in (
        ("data", ("corpus", "tokenizer", "block_size", "batch_size", "valid_fraction", "windows")),
        ("train", ("steps", "device")),
    ):
        for key in keys:
            assert getattr(getattr(new, section), key) == getattr(getattr(old, section), key), key
    built, reference = new.model.build(vocab_size=65), old.model.build(vocab_size=65)
    assert (built.positional, built.activation, built.norm) == ("rope", "swiglu", "rmsnorm")
    assert (built.norm_position, built.bias) == ("pre", False)
    assert (reference.positional, reference.activation) == ("learned", "gelu")
    for key in ("d_model", "n_heads", "n_decoder_layers", "max_len"):
        assert getattr(built, key) == getattr(reference, key), key
    count = {
        name: sum(p.numel() for p in build_model(config).parameters())
        for name, config in (("new", built), ("old", reference))
    }
    assert abs(count["new"] - count["old"]) / count["old"] < 0.03, count
