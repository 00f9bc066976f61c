"""[segment_recurrence]: a language-model run trained a segment at a time after the memory of
the one before, its objective reading blocks as `forward_segments` does, and the runs it
refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnkit.data.batch import shift_targets
from attnkit.errors import AttnkitError
from attnkit.models.segment_memory import forward_segments
from attnkit.run import RunFolder
from attnkit.train.run_config import RunConfig
from attnkit.train.segment_recurrence import SegmentRecurrenceObjective, recurrent_objective
from attnkit.train.tasks import build_task, train
from tests.helpers import tiny_model


def _config(tmp_path: Path, positional: str = "rope", **sections: dict) -> RunConfig:
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat and the dog ran\n" * 40)
    model = {"preset": "gpt-tiny", "n_decoder_layers": 2, "d_model": 16, "n_heads": 2,
             "d_ff": 32, "max_len": 16, "positional": positional}  # fmt: skip
    return RunConfig.from_dict(
        {
            "model": model,
            "data": {
                "task": "language-model",
                "corpus": str(text),
                "tokenizer": "char",
                "block_size": 12,
                "batch_size": 4,
            },
            "train": {"out_dir": str(tmp_path / "run"), "steps": 6, "threads": 1, "warmup": 1},
            "eval": {"every": 3, "max_batches": 2},
            **sections,
        }
    )


def test_a_language_model_trains_segment_by_segment(tmp_path: Path) -> None:
    config = _config(tmp_path, segment_recurrence={"segment": 4})
    setup = build_task(config)
    assert isinstance(setup.objective, SegmentRecurrenceObjective)
    batch = next(iter(setup.train_data))
    dec_in, _, _ = shift_targets(batch.tgt, batch.tgt_mask, ignore=-100)
    model = setup.model.eval()
    hidden = setup.objective.run(model, batch, dec_in, None)
    logits, _ = forward_segments(model, dec_in, segment=4)
    torch.testing.assert_close(model.head(hidden), logits)
    result = train(config)
    assert result.stopped == "finished"
    records = RunFolder(tmp_path / "run").read_metrics()
    losses = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(losses) == 2 and losses[-1] < losses[0]


@pytest.mark.parametrize(
    ("positional", "sections", "match"),
    [
        ("sinusoidal", {"segment_recurrence": {"segment": 4}}, "relative positions"),
        ("rope", {"segment_recurrence": {"segment": 12, "mem_len": 8}}, "max_len"),
    ],
)
def test_runs_that_cannot_carry_a_memory_are_refused(
    tmp_path: Path, positional: str, sections: dict, match: str
) -> None:
    with pytest.raises(AttnkitError, match=match):
        build_task(_config(tmp_path, positional, **sections))


def test_a_memory_without_segments_is_refused() -> None:
    with pytest.raises(AttnkitError, match=r"segment_recurrence\.segment"):
        RunConfig.from_dict(
            {"data": {"task": "language-model"}, "segment_recurrence": {"mem_len": 4}}
        )


@pytest.mark.parametrize(
    "sections",
    [
        {"data": {"task": "translation"}, "segment_recurrence": {"segment": 4}},
        {
            "data": {"task": "language-model"},
            "segment_recurrence": {"segment": 4},
            "scheduled_sampling": {"decay": "constant", "k": 0.5},
        },
    ],
)
def test_only_a_language_model_alone_trains_with_a_memory(sections: dict) -> None:
    config = RunConfig.from_dict(sections)
    model = tiny_model("decoder", positional="rope")
    with pytest.raises(AttnkitError, match="language-model"):
        recurrent_objective(config, model)
