"""[segment_recurrence]: a language-model run trained a segment at a time after the memory of
the one before, its objective reading blocks as `forward_segments` does, and the runs it
refuses."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from attnkit.data.batch import shift_targets
from attnkit.data.datasets import LanguageModelDataset
from attnkit.errors import AttnkitError
from attnkit.models.segment_memory import forward_segment, forward_segments
from attnkit.run import RunFolder
from attnkit.train.run_config import RunConfig
from attnkit.train.segment_recurrence import (
    SegmentRecurrenceObjective,
    SegmentRecurrenceSection,
    StreamBatch,
    StreamBlocks,
    recurrent_objective,
)
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


# -- the memory carried from one batch to the next (carry = "stream") -----------------------------


def _stream_loader(blocks, rows: int, rank: int = 0, world_size: int = 1) -> list:
    streams = StreamBlocks(blocks, rows, rank, world_size)
    return list(DataLoader(streams, batch_sampler=streams.batches(), collate_fn=streams.collate))


def test_stream_blocks_give_each_row_the_next_block_of_its_own_stream() -> None:
    blocks = LanguageModelDataset(np.arange(103), 4, pad_id=0)  # 25 blocks of 4 (+1) tokens
    batches = _stream_loader(blocks, rows=3)
    assert len(batches) == 25 // 3  # 8 blocks a stream, the 25th left over
    assert [b.first for b in batches] == [True] + [False] * 7
    for t, batch in enumerate(batches):
        assert isinstance(batch, StreamBatch) and batch.tgt.shape == (3, 5)
        # row j, batch t: block j * 8 + t, tokens 4 (8 j + t) .. + 4
        starts = [4 * (8 * j + t) for j in range(3)]
        assert batch.tgt[:, 0].tolist() == starts
    for before, after in itertools.pairwise(batches):  # each row reads on where it stopped
        assert torch.equal(before.tgt[:, -1], after.tgt[:, 0])
    # Two ranks read 2 x 2 streams of 6 blocks, each its own.
    ranks = [_stream_loader(blocks, rows=2, rank=r, world_size=2) for r in (0, 1)]
    assert ranks[0][0].tgt[:, 0].tolist() == [0, 24] and ranks[1][0].tgt[:, 0].tolist() == [48, 72]
    moved = ranks[0][1].to("cpu")
    assert isinstance(moved, StreamBatch) and not moved.first


def _carrying(mem_len: int = 0) -> SegmentRecurrenceObjective:
    return SegmentRecurrenceObjective(
        SegmentRecurrenceSection(segment=4, mem_len=mem_len, carry="stream")
    )


@pytest.mark.parametrize("mem_len", [0, 6])
def test_batch_t_plus_1_attends_to_the_memory_batch_t_left(mem_len: int) -> None:
    model = tiny_model("decoder", positional="rope", max_len=32).eval()
    ids = torch.randint(5, 24, (2, 16))
    objective = _carrying(mem_len)
    first = objective.run(model, StreamBatch(first=True), ids[:, :8], None)
    second = objective.run(model, StreamBatch(first=False), ids[:, 8:], None)
    # What one reading of the whole stream, segment after segment, gives.
    whole, memory = forward_segments(model, ids, segment=4, mem_len=mem_len or 4)
    torch.testing.assert_close(model.head(torch.cat((first, second), 1)), whole)
    for carried, expected in zip(objective.memories[False], memory, strict=True):
        torch.testing.assert_close(carried, expected)
        assert carried.shape[1] == (mem_len or 4)
    # The first batch of a pass starts without a memory, as a batch of `block` does.
    again = objective.run(model, StreamBatch(first=True), ids[:, 8:], None)
    alone, _ = forward_segments(model, ids[:, 8:], segment=4, mem_len=mem_len or 4)
    torch.testing.assert_close(model.head(again), alone)
    # Without carry, every batch starts afresh.
    block = SegmentRecurrenceObjective(SegmentRecurrenceSection(segment=4))
    block.run(model, StreamBatch(first=True), ids[:, :8], None)
    torch.testing.assert_close(
        model.head(block.run(model, StreamBatch(first=False), ids[:, 8:], None)), alone
    )


def test_no_gradient_flows_from_batch_t_plus_1_into_batch_t() -> None:
    model = tiny_model(
        "decoder", positional="rope", max_len=32, dropout=0.0, embedding_dropout=0.0
    ).train()
    ids = torch.randint(5, 24, (2, 16))
    objective = _carrying()
    first = objective.run(model, StreamBatch(first=True), ids[:, :8], None)
    first.square().sum().backward()  # batch t's step: its graph is freed
    model.zero_grad()
    assert not any(m.requires_grad for m in objective.memories[True])
    second = objective.run(model, StreamBatch(first=False), ids[:, 8:], None)
    second.square().sum().backward()  # reaches nothing of batch t's (freed) graph
    carried = {n: p.grad.clone() for n, p in model.named_parameters()}
    # The same step with batch t's memory made where no gradient is recorded at all.
    model.zero_grad()
    with torch.no_grad():
        _, memory = forward_segments(model, ids[:, :8], segment=4)
    hidden = []
    for start in (8, 12):
        out, memory = forward_segment(model, ids[:, start : start + 4], memory, need_logits=False)
        hidden.append(out.hidden)
    torch.cat(hidden, 1).square().sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(carried[name], p.grad, msg=name)
    # A validation between two steps keeps a memory of its own.
    kept = objective.memories[True]
    with torch.no_grad():
        objective.run(model.eval(), StreamBatch(first=True), ids[:, :8], None)
    assert objective.memories[True] is kept and False in objective.memories


def test_a_language_model_trains_with_its_memory_carried_across_batches(tmp_path: Path) -> None:
    config = _config(tmp_path, segment_recurrence={"segment": 4, "carry": "stream"})
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, windows="blocks"))
    setup = build_task(config)
    batches = list(setup.train_data)
    # 1,440 training characters: 119 blocks of 12, 4 streams of 29 (the last 3 left over)
    assert len(batches) == 29 and batches[0].first and not any(b.first for b in batches[1:])
    assert all(isinstance(b, StreamBatch) for b in setup.val_data)
    result = train(config)
    assert result.stopped == "finished"
    losses = [r["val_loss"] for r in RunFolder(tmp_path / "run").read_metrics() if "val_loss" in r]
    assert len(losses) == 2 and losses[-1] < losses[0]


@pytest.mark.parametrize(
    ("data", "match"),
    [({"windows": "random"}, "data.windows = 'blocks'"), ({"batch_size": 200}, "200 streams")],
)
def test_a_carry_across_batches_that_cannot_read_streams_is_refused(
    tmp_path: Path, data: dict, match: str
) -> None:
    config = _config(tmp_path, segment_recurrence={"segment": 4, "carry": "stream"})
    data = {"windows": "blocks"} | data
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, **data))
    with pytest.raises(AttnkitError, match=re.escape(match)):
        build_task(config)
    with pytest.raises(AttnkitError, match=r"segment_recurrence\.carry"):
        SegmentRecurrenceSection(carry="stream")
