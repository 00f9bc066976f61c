"""Language-model windows: fresh offsets each epoch for training, fixed blocks for validation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from attnkit.data import LanguageModelDataset
from attnkit.errors import AttnkitError
from attnkit.train import Trainer
from attnkit.train.run_config import TrainSection
from tests.helpers import VOCAB, tiny_model

B = 8
STREAM = np.random.default_rng(0).integers(5, VOCAB, size=403)


def dataset(windows: str, seed: int = 0) -> LanguageModelDataset:
    return LanguageModelDataset(STREAM, B, pad_id=0, windows=windows, seed=seed)


def starts(data: LanguageModelDataset, epoch: int) -> np.ndarray:
    data.set_epoch(epoch)
    return data.starts.copy()


@pytest.mark.parametrize("windows", ["random", "shifted", "blocks"])
def test_every_window_is_a_slice_of_the_stream_of_block_size_plus_one(windows):
    data = dataset(windows)
    for epoch in range(5):
        data.set_epoch(epoch)
        assert len(data) == (len(STREAM) - 1) // B
        for i in range(len(data)):
            start = int(data.starts[i])
            assert 0 <= start <= len(STREAM) - B - 1
            assert np.array_equal(data[i], STREAM[start : start + B + 1])


def test_random_windows_lie_at_many_offsets_and_change_every_epoch():
    data = dataset("random")
    epochs = [starts(data, e) for e in range(20)]
    offsets = np.concatenate(epochs)
    # Not the block grid: nearly every residue mod B and most positions of the text occur.
    assert len(set((offsets % B).tolist())) == B
    assert len(set(offsets.tolist())) > 0.6 * (len(STREAM) - B)
    assert all(not np.array_equal(a, b) for a, b in itertools.pairwise(epochs))


def test_shifted_windows_move_the_whole_grid_by_one_offset_per_epoch():
    data = dataset("shifted")
    shifts = set()
    for epoch in range(30):
        s = starts(data, epoch)
        assert np.all(np.diff(s[:-1]) == B)  # one grid (the last window may keep its place)
        shifts.add(int(s[0]))
    assert len(shifts) > 4 and shifts <= set(range(B))


def test_windows_depend_only_on_seed_and_epoch():
    a, b = dataset("random", seed=3), dataset("random", seed=3)
    assert np.array_equal(starts(a, 7), starts(b, 7))
    assert np.array_equal(starts(a, 2), starts(dataset("random", seed=3), 2))
    assert not np.array_equal(starts(a, 2), starts(dataset("random", seed=4), 2))


def test_fixed_blocks_are_the_same_every_epoch_and_what_validation_reads():
    data = dataset("blocks")
    grid = B * np.arange(len(data))
    assert all(np.array_equal(starts(data, e), grid) for e in range(3))
    assert data[1][0] == data[0][-1]  # blocks overlap by one: every token a label once


def test_passes_count_the_tokens_read_over_the_stream():
    data = dataset("random")
    assert data.passes(len(data)) == pytest.approx(len(data) * (B + 1) / len(STREAM))


def test_an_unknown_placement_is_refused():
    with pytest.raises(AttnkitError, match="windows 'grid' is not one of random, shifted, blocks"):
        dataset("grid")


def settings(tmp_path, **changes) -> TrainSection:
    base = {"out_dir": str(tmp_path), "steps": 9, "lr": 3e-3, "warmup": 2, "log_every": 3}
    return TrainSection(**{**base, "save_every": 100, "threads": 1, **changes})


def batches(data: LanguageModelDataset) -> DataLoader:
    # Its own generator keeps the loader off the global RNG, as `attnkit train`'s loaders do.
    return DataLoader(
        data, batch_size=8, collate_fn=data.collate, generator=torch.Generator().manual_seed(0)
    )


def test_a_resume_across_the_change_of_epoch_reads_the_same_windows(tmp_path):
    """An epoch of 6 batches: stop at step 4, resume, cross into the next epoch at step 7."""
    data = dataset("random", seed=1)
    loader = batches(data)
    assert len(loader) == 7  # 50 windows: the last batch has 2
    straight = Trainer(tiny_model("decoder", dropout=0.1), loader, train=settings(tmp_path / "a"))
    straight.fit()

    data = dataset("random", seed=1)
    loader = batches(data)
    first = Trainer(tiny_model("decoder", dropout=0.1), loader, train=settings(tmp_path / "b"))
    first.callbacks.append(lambda info: info["step"] == 4 and first.request_stop())
    assert first.fit().step == 4
    resumed = Trainer(
        tiny_model("decoder", seed=5, dropout=0.1), loader, train=settings(tmp_path / "b")
    )
    result = resumed.fit(resume=True)
    assert result.step == 9 and resumed.epoch == 1
    for name, value in straight.model.state_dict().items():
        assert value.equal(result.model.state_dict()[name]), name
