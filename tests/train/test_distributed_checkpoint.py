"""FSDP in one process (over a group of one): what its sharded checkpoints hold, resuming
across `train.parallel`, a save cut short, what readers of the run folder load, and the
settings that change its arithmetic (LoRA, bf16, accumulation)."""

import shutil

import pytest
import torch

from attnkit.errors import AttnkitError
from attnkit.run import RunFolder, load_pretrained
from attnkit.train import Trainer, distributed_checkpoint
from attnkit.train import distributed as dist
from attnkit.train.checkpoint import load_trainer_state
from attnkit.train.run_config import TrainSection
from tests.helpers import global_batches, parallel_model, parallel_settings


@pytest.fixture(autouse=True)
def _leave_the_group():
    yield
    dist.teardown()


def fit(run, steps=4, resume=False, lora=False, **changes):
    return Trainer(
        parallel_model(lora),
        global_batches(4),
        train=parallel_settings(run, steps, **changes),
    ).fit(resume=resume)


def weights(result) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in result.model.state_dict().items()}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Four steps with FSDP, the reference every resume here must reach bit for bit."""
    result = fit(tmp_path_factory.mktemp("straight") / "run", parallel="fsdp")
    dist.teardown()
    return weights(result)


def assert_same(got, expected):
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[name], value) for name, value in expected.items())


def test_a_sharded_run_keeps_the_optimizer_in_slices_and_the_whole_model_for_readers(
    straight, tmp_path
):
    fit(tmp_path / "run", parallel="fsdp")
    folder = RunFolder(tmp_path / "run")
    assert load_trainer_state(folder)["optimizer"] is None  # it is in the slices
    assert (folder.step_shards(4) / ".metadata").is_file()
    assert list(folder.step_shards(4).glob("__0_0.distcp"))
    # `translate`, `export hf` and averaging read the whole model, gathered by rank 0.
    assert_same(load_pretrained(folder.root).state_dict(), straight)


@pytest.mark.parametrize(("before", "after"), [("fsdp", "ddp"), ("ddp", "fsdp")])
def test_a_run_resumes_sharded_or_not_whichever_saved_it(straight, tmp_path, before, after):
    """One process reads its one slice back exactly, so each way continues bit for bit
    (sharded to sharded: the next test, and two ranks in test_parallel.py)."""
    fit(tmp_path / "run", 2, parallel=before)
    assert_same(weights(fit(tmp_path / "run", resume=True, parallel=after)), straight)


def test_a_sharded_save_cut_short_leaves_the_previous_checkpoint_the_latest(
    straight, tmp_path, monkeypatch
):
    """Killed while writing its slices (here: stopped by an error inside DCP's save), a save
    leaves a staging folder that names no step; the resume removes it and goes on."""
    fit(tmp_path / "run", 2, parallel="fsdp")
    save = distributed_checkpoint.dcp.save

    def save_then_fail(state, checkpoint_id):
        save(state, checkpoint_id=checkpoint_id)
        raise OSError("the machine went away")

    monkeypatch.setattr(distributed_checkpoint.dcp, "save", save_then_fail)
    with pytest.raises(OSError, match="went away"):
        fit(tmp_path / "run", resume=True, parallel="fsdp")
    monkeypatch.undo()
    folder = RunFolder(tmp_path / "run")
    assert load_trainer_state(folder)["step"] == 2
    staged = list(folder.step_dir(4).glob(".sharded.*.tmp"))
    assert len(staged) == 1 and not folder.step_shards(4).exists()
    assert_same(weights(fit(tmp_path / "run", resume=True, parallel="fsdp")), straight)
    assert not staged[0].exists()


def test_a_trainer_state_without_its_slices_is_refused_in_one_sentence(tmp_path):
    fit(tmp_path / "run", 2, parallel="fsdp")
    shutil.rmtree(RunFolder(tmp_path / "run").step_shards(2))
    with pytest.raises(AttnkitError, match=r"no whole sharded checkpoint at .*step-0000002"):
        fit(tmp_path / "run", resume=True, parallel="fsdp")


def test_lora_under_fsdp_trains_the_factors_and_saves_the_merged_model(tmp_path):
    result = fit(tmp_path / "run", 2, lora=True, parallel="fsdp")
    plain = fit(tmp_path / "plain", 2, lora=True)
    assert_same(weights(result), weights(plain))  # the frozen base sharded, the factors trained
    merged = load_pretrained(tmp_path / "run").state_dict()
    assert not any("lora_" in name for name in merged)
    assert_same(merged, load_pretrained(tmp_path / "plain").state_dict())


def test_bf16_under_fsdp_gathers_bf16_weights_and_keeps_float32_masters(tmp_path):
    fp32 = fit(tmp_path / "fp32", 2, parallel="fsdp")
    bf16 = fit(tmp_path / "bf16", 2, parallel="fsdp", precision="bf16", reduce_precision="bf16")
    assert all(t.dtype == torch.float32 for t in bf16.model.state_dict().values())
    loss = [[r["train_loss"] for r in run.history if "train_loss" in r] for run in (fp32, bf16)]
    torch.testing.assert_close(torch.tensor(loss[1]), torch.tensor(loss[0]), rtol=2e-2, atol=0)
    assert loss[1] != loss[0]  # computed in bf16 indeed


def test_accumulated_micro_batches_under_fsdp_add_up_to_the_whole_batch(tmp_path):
    """Each micro-batch's gradients are reduce-scattered and added to the slices."""
    halves = global_batches(2, 0, 2) + global_batches(2, 1, 2)
    batches = [halves[0], halves[2], halves[1], halves[3]]  # both halves of step 1, of step 2
    accumulated = Trainer(
        parallel_model(),
        batches,
        train=parallel_settings(tmp_path / "run", 2, parallel="fsdp", accumulate=2),
    ).fit()
    whole = fit(tmp_path / "whole", 2)
    for name, value in whole.model.state_dict().items():
        torch.testing.assert_close(accumulated.model.state_dict()[name], value, msg=name)


def test_fp16_under_fsdp_is_refused_in_one_sentence():
    with pytest.raises(AttnkitError, match=r"use .bf16. with train\.parallel .fsdp."):
        TrainSection(parallel="fsdp", precision="fp16")
