"""Train short, test long: a loaded model may change its length, RoPE's scaling and its window,
what its weights do not fix, and nothing else; from Python and on the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from attnkit.errors import AttnkitError
from attnkit.models import build_model
from attnkit.run import load_pretrained, save_pretrained
from tests.helpers import tiny_config, tiny_run


def _saved(path: Path, **changes: object) -> Path:
    torch.manual_seed(0)
    model = build_model(tiny_config("decoder", dropout=0.0, embedding_dropout=0.0, **changes))
    save_pretrained(model, path)
    return path


@pytest.mark.parametrize("positional", ["sinusoidal", "rope", "xpos", "alibi"])
def test_a_longer_max_len_reads_past_the_trained_length_and_keeps_the_start(
    tmp_path: Path, positional: str
) -> None:
    run = _saved(tmp_path / "run", positional=positional)  # max_len 32
    short = load_pretrained(run)
    long = load_pretrained(run, overrides={"max_len": 96})
    assert long.config.max_len == 96
    ids = torch.randint(0, long.config.vocab_size, (1, 80))
    with torch.no_grad():
        logits = long(ids).logits
        assert torch.allclose(logits[:, :30], short(ids[:, :30]).logits, atol=1e-5)
    assert logits.shape[1] == 80 and torch.isfinite(logits).all()


def test_rope_scaling_changes_the_positions_only(tmp_path: Path) -> None:
    run = _saved(tmp_path / "run", positional="rope")
    scaled = load_pretrained(run, overrides={"max_len": 128, "rope_scaling": 4.0})
    assert scaled.config.rope_scaling == 4.0
    plain = load_pretrained(run)
    ids = torch.randint(0, plain.config.vocab_size, (1, 20))
    with torch.no_grad():
        assert not torch.allclose(scaled(ids).logits, plain(ids).logits)


def test_what_the_weights_fix_is_refused(tmp_path: Path) -> None:
    learned = _saved(tmp_path / "learned", positional="learned")
    for length in (64, 16):
        with pytest.raises(AttnkitError, match="a position table of 32 rows, which fixes"):
            load_pretrained(learned, overrides={"max_len": length})
    assert load_pretrained(learned, overrides={"max_len": 32}).config.max_len == 32
    with pytest.raises(AttnkitError, match=r"model\.d_model cannot change once a model is trained"):
        load_pretrained(learned, overrides={"d_model": 8})


def test_the_command_line_sets_them(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tiny_run(tmp_path / "run", "decoder", max_len=24)
    args = ["generate", str(run), "--prompt", "a", "--greedy", "--max-new-tokens", "40"]
    assert main([*args, "--set", "model.max_len=64"]) == 0
    assert main([*args, "--set", "model.n_heads=4"]) == 2
    assert "model.n_heads cannot change" in capsys.readouterr().err
    assert main([*args, "--set", "train.lr=1"]) == 2
    assert "sets model settings (as model.max_len=512)" in capsys.readouterr().err
    assert main([*args, "--set", "model.max_len=many"]) == 2
