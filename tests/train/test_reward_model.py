"""The reward model: the Bradley-Terry loss against a hand computation, the score read at the last
real token of either shape, and `data.task = "reward-model"` through `attnkit train`, whose run
folder loads back and ranks held-out pairs above chance."""

import math

import pytest
import torch

from attnkit import AttnkitError
from attnkit.cli import main
from attnkit.data.preference import PreferenceDataset, preference_batch, read_pairs
from attnkit.run import RunFolder
from attnkit.train.reward_model import (
    BradleyTerry,
    add_reward_head,
    bradley_terry_loss,
    load_reward_model,
    response_batch,
    reward_scores,
)
from tests.helpers import tiny_model, tiny_run, write_preference_pairs

# Letters that tiny_run's character tokenizer knows.
ALPHABET = "adehiklnprstu"
PAIRS = [([3, 4, 5], [6, 7], [9, 10, 11]), ([8, 9], [12, 13, 14], [15])]
SEQ2SEQ_PAIRS = [([3, 4, 5, 2], [6, 7, 2], [9, 10, 11, 2]), ([8, 2], [12, 13, 14, 2], [15, 2])]


def test_the_bradley_terry_loss_is_minus_log_sigmoid_of_the_score_difference():
    chosen, rejected = torch.tensor([2.0, -1.0, 0.3]), torch.tensor([0.5, 0.0, 0.3])
    by_hand = [math.log(1 + math.exp(-(c - r))) for c, r in ((2.0, 0.5), (-1.0, 0.0), (0.3, 0.3))]
    assert bradley_terry_loss(chosen, rejected).tolist() == pytest.approx(by_hand, abs=1e-6)
    assert by_hand[2] == pytest.approx(math.log(2))  # a tie: probability one half


def score_alone(model, src, tgt) -> float:
    """r of one unpadded row: the head on the top state of its last token."""
    with torch.no_grad():
        if src is None:
            hidden = model(torch.tensor([tgt]), need_logits=False).hidden
        else:
            hidden = model(torch.tensor([src]), torch.tensor([tgt]), need_logits=False).hidden
        return model.reward_head(hidden[0, -1]).item()


@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_the_score_is_the_head_on_the_last_real_token_whatever_the_padding(shape):
    model = add_reward_head(tiny_model(shape), seed=1).eval()
    with torch.no_grad():
        model.reward_head.bias.fill_(0.25)
    seq2seq = shape == "encoder-decoder"
    pairs = SEQ2SEQ_PAIRS if seq2seq else PAIRS
    batch = preference_batch(pairs, pad_id=0, decoder_start_id=1 if seq2seq else None)
    with torch.no_grad():
        scores = reward_scores(model, batch)
    rows = [(p, c) for p, c, _ in pairs] + [(p, r) for p, _, r in pairs]
    for i, (prompt, response) in enumerate(rows):
        src, tgt = (prompt, [1, *response]) if seq2seq else (None, [*prompt, *response])
        assert scores[i].item() == pytest.approx(score_alone(model, src, tgt), abs=1e-5)
    # The objective is the summed loss of the pairs, counted in pairs.
    terms = BradleyTerry()(model, batch)
    expected = bradley_terry_loss(scores[:2], scores[2:]).sum().item()
    assert terms.loss.item() == pytest.approx(expected, abs=1e-5)
    assert terms.tokens.item() == 2


def test_response_rows_are_the_rows_the_reward_model_trained_on():
    decoder = response_batch([[3, 4]], [[5, 6, 7]], pad_id=0)
    assert decoder.src is None and decoder.tgt.tolist() == [[3, 4, 5, 6, 7]]
    seq2seq = response_batch([[3, 4, 2]], [[5, 6]], pad_id=0, decoder_start_id=1, eos_id=2)
    assert seq2seq.src.tolist() == [[3, 4, 2]] and seq2seq.tgt.tolist() == [[1, 5, 6, 2]]
    batch = preference_batch([([3, 4, 2], [5, 6, 2], [7, 2])], pad_id=0, decoder_start_id=1)
    assert seq2seq.tgt.tolist()[0] == batch.tgt.tolist()[0]


def test_an_encoder_and_a_model_without_a_head_are_refused():
    with pytest.raises(AttnkitError, match="not of an encoder one"):
        add_reward_head(tiny_model("encoder"))
    with pytest.raises(AttnkitError, match="has no reward head"):
        reward_scores(tiny_model("decoder"), preference_batch(PAIRS, pad_id=0))


def reward_model_config(tmp_path, base, out: str = "rm") -> str:
    corpus = write_preference_pairs(tmp_path / "pairs", ALPHABET, train=240)
    path = tmp_path / f"{out}.toml"
    path.write_text(
        f"""
[data]
task = "reward-model"
corpus = "{corpus}"
max_tokens = 200

[train]
init_from = "{base}"
out_dir = "{tmp_path / out}"
steps = 40
lr = 0.01
schedule = "constant"
warmup = 0
threads = 1
log_every = 10
save_every = 40

[eval]
every = 10
metric = "reward_accuracy"
"""
    )
    return str(path)


@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_cli_trains_a_reward_model_that_ranks_held_out_pairs_above_chance(tmp_path, shape):
    base = tiny_run(tmp_path / "base", shape)
    assert main(["train", reward_model_config(tmp_path, base)]) == 0
    run = tmp_path / "rm"
    evals = [r for r in RunFolder(run).read_metrics() if "reward_accuracy" in r]
    assert [r["step"] for r in evals] == [10, 20, 30, 40]
    # 24 held-out pairs: chance is one half; the chosen response follows a rule.
    assert evals[-1]["reward_accuracy"] >= 0.75
    assert evals[-1]["val_loss"] < math.log(2)
    assert evals[-1]["reward_chosen"] > evals[-1]["reward_rejected"]
    # The run folder loads back, head and body, and ranks the held-out pairs as the last
    # evaluation measured (its weights are the last step's).
    model = load_reward_model(run)
    assert model.config.shape == shape
    seq2seq = shape == "encoder-decoder"
    pairs = PreferenceDataset(
        read_pairs(tmp_path / "pairs" / "val.jsonl"),
        RunFolder(run).load_tokenizer(),
        decoder_start_id=1 if seq2seq else None,
        max_len=40,
        name="val",
    )
    batch = pairs.collate([pairs[i] for i in range(len(pairs))])
    with torch.no_grad():
        scores = reward_scores(model, batch)
    accuracy = (scores[: batch.pairs] > scores[batch.pairs :]).double().mean().item()
    assert accuracy == pytest.approx(evals[-1]["reward_accuracy"])


def test_a_folder_without_a_reward_head_is_refused_by_name(tmp_path):
    base = tiny_run(tmp_path / "base", "decoder")
    with pytest.raises(AttnkitError, match="holds a model without a reward head"):
        load_reward_model(base)
    with pytest.raises(AttnkitError, match=r"config\.json is missing"):
        load_reward_model(tmp_path / "nothing")
