import random
from fractions import Fraction

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from attnkit.errors import AttnkitError
from attnkit.run import RunFolder, load_pretrained
from attnkit.train import checkpoint as ckpt
from tests.helpers import tiny_model


def state(step: int) -> dict:
    return {"step": step, "payload": torch.full((3,), float(step))}


def test_average_is_the_element_wise_mean(tmp_path):
    models = [tiny_model(seed=s) for s in range(3)]
    for step, model in enumerate(models, start=1):
        ckpt.save_checkpoint(RunFolder(tmp_path), model, state(step), keep_last=3)
    assert RunFolder(tmp_path).saved_steps() == [1, 2, 3]
    assert ckpt.average_last(RunFolder(tmp_path), 2) == [2, 3]
    averaged = load_file(str(RunFolder(tmp_path).weights))
    for name, value in averaged.items():
        expected = (models[1].state_dict()[name] + models[2].state_dict()[name]) / 2
        torch.testing.assert_close(value, expected, rtol=0, atol=1e-7)
    # The folder's model is now the average, loadable as any run folder.
    model = load_pretrained(tmp_path)
    torch.testing.assert_close(model.head.weight, averaged["head.weight"], rtol=0, atol=0)


def test_keep_last_prunes_older_steps(tmp_path):
    model = tiny_model()
    for step in (10, 20, 30, 40):
        ckpt.save_checkpoint(RunFolder(tmp_path), model, state(step), keep_last=2)
    assert RunFolder(tmp_path).saved_steps() == [30, 40]
    assert ckpt.load_trainer_state(RunFolder(tmp_path))["step"] == 40


def test_interrupted_write_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch):
    good = tiny_model(seed=1)
    ckpt.save_checkpoint(RunFolder(tmp_path), good, state(1), keep_last=3)

    real_save = torch.save

    def crash_midway(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        with open(f, "r+b") as handle:  # half the bytes reach the disk, then the process dies
            handle.truncate(handle.seek(0, 2) // 2)
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(RunFolder(tmp_path), tiny_model(seed=2), state(2), keep_last=3)
    monkeypatch.undo()

    fresh = tiny_model(seed=3)
    restored = ckpt.load_checkpoint(RunFolder(tmp_path), fresh)
    assert restored["step"] == 1 and torch.equal(restored["payload"], torch.full((3,), 1.0))
    for (name, a), b in zip(good.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert not list(tmp_path.glob(".*.tmp"))


def test_missing_or_broken_state_is_one_sentence(tmp_path):
    with pytest.raises(AttnkitError, match=r"has no trainer_state\.pt to resume from"):
        ckpt.load_trainer_state(RunFolder(tmp_path))
    path = RunFolder(tmp_path).trainer_state
    torch.save({"step": 3, "payload": torch.ones(100)}, path)
    whole = path.read_bytes()
    # Damaged, not "holding Python objects" as it was called (issue 39, POOR): cut short by a
    # full disk, emptied, overwritten.
    for damaged in (whole[: len(whole) // 2], b"", b"not a checkpoint"):
        path.write_bytes(damaged)
        with pytest.raises(AttnkitError, match=r"trainer_state\.pt is damaged \(.+\): it cannot"):
            ckpt.load_trainer_state(RunFolder(tmp_path))
    torch.save([1, 2], path)
    with pytest.raises(AttnkitError, match="is not a trainer state attnkit wrote; remove it"):
        ckpt.load_trainer_state(RunFolder(tmp_path))


def test_a_trainer_state_holding_python_objects_is_refused_without_torch_s_advice(tmp_path):
    """torch's error suggests weights_only=False, which would run the file's code."""
    torch.save({"step": 1, "payload": Fraction(1, 3)}, RunFolder(tmp_path).trainer_state)
    with pytest.raises(AttnkitError) as info:
        ckpt.load_trainer_state(RunFolder(tmp_path))
    message = str(info.value)
    assert "will not unpickle" in message and "weights_only" not in message


def test_rng_state_round_trip():
    saved = ckpt.rng_state()
    a = (torch.rand(3), random.random(), np.random.rand())
    ckpt.set_rng_state(saved)
    b = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]
