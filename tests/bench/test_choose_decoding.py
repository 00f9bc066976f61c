"""bench/choose_decoding.py: validation chooses the checkpoints, then beam and length penalty;
test is decoded once, with the choice."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnkit.cli import main as attnkit
from attnkit.errors import AttnkitError
from attnkit.run import load_run
from bench import choose_decoding
from bench.choose_decoding import LOWERCASED_BLEU, Trial, use_weights, weight_sets
from tests.helpers import tiny_g2p_run, tiny_run

TINY = [  # the GPU recipe's loop and data, small enough for a test
    "train.device=cpu",
    "train.threads=1",
    "train.steps=4",
    "train.max_minutes=0",
    "train.decay_over=steps",
    "train.warmup=2",
    "train.save_every=2",
    "train.average_last=2",
    "eval.every=4",
    "eval.decode_examples=4",
    "data.max_tokens=600",
    "model.n_encoder_layers=1",
    "model.n_decoder_layers=1",
    "model.d_model=32",
    "model.d_ff=64",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, samples: Path) -> Path:
    """The `multi30k_de_en_gpu` recipe, 4 steps on the sample of Multi30k: checkpoints at
    steps 2 and 4, their mean as model.safetensors."""
    out = tmp_path_factory.mktemp("choose") / "run"
    settings = [*TINY, f"data.data_dir={samples}", f"train.out_dir={out}"]
    assert (
        attnkit(["train", "multi30k_de_en_gpu", *(a for s in settings for a in ("--set", s))]) == 0
    )
    return out


def choose(run: Path, tmp_path: Path, *options: str) -> dict:
    out = tmp_path / "choice.json"
    quick = ["--limit", "6", "--max-new-tokens", "5", "--batch-size", "4", "--out", str(out)]
    choose_decoding.main([str(run), *quick, *options])
    return json.loads(out.read_text())


def test_validation_chooses_and_test_is_decoded_once(trained, tmp_path, monkeypatch, capsys):
    splits = []

    def counted(run, data, generation, **kwargs):
        splits.append((data.split, generation.num_beams, generation.length_penalty))
        return score_run(run, data, generation, **kwargs)

    score_run = choose_decoding.score_run
    monkeypatch.setattr(choose_decoding, "score_run", counted)
    hypotheses = tmp_path / "test.en"
    result = choose(
        trained, tmp_path, "--averages", "1", "2", "--probe-beam", "2", "--beams", "1", "2",
        "--length-penalties", "1.0", "1.2", "--output", str(hypotheses),
    )  # fmt: skip
    trials = result["trials"]
    # Stage 1: each candidate at the probe beam; stage 2: the grid on the chosen weights, with
    # greedy once and the probe's own setting not decoded again.
    assert [(t["weights"], t["beam"], t["length_penalty"]) for t in trials[:2]] == [
        ("last checkpoint (4)", 2, 1.0),
        ("mean of last 2 (2-4)", 2, 1.0),
    ]
    first = min(trials[:2], key=lambda t: -t["scores"][LOWERCASED_BLEU])
    assert {t["weights"] for t in trials[2:]} == {first["weights"]}
    assert sorted((t["beam"], t["length_penalty"]) for t in trials[2:]) == [(1, 1.0), (2, 1.2)]
    grid = [t for t in trials if t["weights"] == first["weights"]]
    best = min(grid, key=lambda t: -t["scores"][LOWERCASED_BLEU])  # the first of any tie
    assert result["chosen"] == {k: best[k] for k in ("weights", "beam", "length_penalty")}
    # Validation 4 times, test once, with the chosen beam and penalty.
    assert splits[:-1] == [("val", t["beam"], t["length_penalty"]) for t in trials]
    assert splits[-1] == ("test_2016_flickr", best["beam"], best["length_penalty"])
    scores = {s["name"]: s for s in result["test_scores"]}
    assert "case:lc" in scores[LOWERCASED_BLEU]["signature"]
    assert "case:mixed" in scores["BLEU"]["signature"]
    assert "test_2016_flickr de->en, 6 sentences" in result["test"]
    assert len(hypotheses.read_text().splitlines()) == 6
    out = capsys.readouterr().out
    assert out.count("test, decoded once") == 1 and "device: cpu" in out


def test_the_candidates_are_means_of_the_last_checkpoints(trained, tmp_path):
    run = load_run(trained)
    sets = weight_sets(run, [1, 2, 5])  # 5 asks more than were kept: the same 2, listed once
    assert {name: [p.parent.name for p in paths] for name, paths in sets.items()} == {
        "last checkpoint (4)": ["step-0000004"],
        "mean of last 2 (2-4)": ["step-0000002", "step-0000004"],
    }
    use_weights(run, sets["last checkpoint (4)"], tmp_path, "cpu")
    last = load_file(str(sets["last checkpoint (4)"][0]))
    for name, value in last.items():
        assert torch.equal(run.model.state_dict()[name], value), name
    use_weights(run, sets["mean of last 2 (2-4)"], tmp_path, "cpu")
    mean = load_file(str(trained / "model.safetensors"))  # the trainer's own average
    for name, value in mean.items():
        assert torch.allclose(run.model.state_dict()[name], value), name
    assert any(not torch.equal(last[name], mean[name]) for name in mean)


def test_error_rates_choose_by_per_then_wer_and_bleu_by_the_lowercased_score():
    def trial(**scores):
        return Trial("w", 1, 1.0, scores, 0.0)

    g2p = [trial(WER=30.0, PER=6.0), trial(WER=25.0, PER=6.0), trial(WER=20.0, PER=6.5)]
    assert min(g2p, key=Trial.key) is g2p[1]
    mt = [trial(BLEU=40.0, **{LOWERCASED_BLEU: 39.0}), trial(BLEU=38.0, **{LOWERCASED_BLEU: 39.5})]
    assert min(mt, key=Trial.key) is mt[1]


def test_a_g2p_run_is_scored_by_error_rates_on_its_test_split(tmp_path):
    run = tiny_g2p_run(tmp_path / "g2p")  # no checkpoints: its own model is the one candidate
    result = choose(run, tmp_path, "--probe-beam", "1", "--beams", "1", "2")
    assert {t["weights"] for t in result["trials"]} == {"the run's model"}
    assert [s["name"] for s in result["test_scores"]] == ["WER", "PER"]
    assert result["test"].startswith("cmudict test graphemes->phonemes, 6 sources")


def test_a_language_model_or_a_zero_is_refused(tmp_path):
    run = tiny_run(tmp_path / "lm", "decoder")
    with pytest.raises(AttnkitError, match="decoding settings are chosen for a translation"):
        choose_decoding.main([str(run)])
    with pytest.raises(SystemExit):
        choose_decoding.main([str(run), "--averages", "0"])
