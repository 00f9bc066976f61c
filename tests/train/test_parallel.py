"""FSDP2 on two gloo processes against one process with the same global batch.

One launch of `fsdp_worker` (two ranks, each half of every global batch) serves every test
here; the one-process side runs in this process, FSDP's over a group of one.
"""

import shutil

import pytest
import torch

from attnkit.run import RunFolder, load_pretrained
from attnkit.train import Trainer
from attnkit.train import distributed as dist
from attnkit.train.checkpoint import load_trainer_state
from attnkit.train.objectives import objective_for
from tests.helpers import global_batches, parallel_model, parallel_settings, run_worker

TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The worker's files; its launch fails at the end, where rank 1 is killed on purpose."""
    out = tmp_path_factory.mktemp("fsdp")
    done = run_worker([*TORCHRUN, "-m", "tests.train.fsdp_worker"], out, check=False)
    if not (out / "dying").exists():
        raise AssertionError(f"the FSDP worker failed before its last run:\n{done.stderr[-6000:]}")
    assert done.returncode != 0, "rank 1 was killed, so the launch must fail"
    return out


@pytest.fixture(autouse=True)
def _leave_the_group():
    yield
    dist.teardown()  # the group of one that FSDP in this process joined


def one_process(out, steps=4, resume=False, **changes):
    """The run of the worker's `train`, in this process on whole global batches."""
    return Trainer(
        parallel_model(),
        global_batches(4),
        train=parallel_settings(out / "run", steps, **changes),
    ).fit(resume=resume)


def whole_gradients(lora: bool) -> dict[str, torch.Tensor]:
    model = parallel_model(lora)
    batch = global_batches(1)[0]
    objective_for("encoder-decoder", 0.1)(model, batch).total.backward()
    return {name: p.grad for name, p in model.named_parameters() if p.requires_grad}


def assert_all_close(got, expected, **tolerance):
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, msg=name, **tolerance)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_fsdp_averages_the_gradients_of_the_ranks_rather_than_summing_them(two_ranks, lora):
    """Each rank's loss is a sum over its half, so the mean of the two ranks' gradients is
    half the gradient of the whole batch's sum; summed (PyTorch issue 162338, gloo) it would
    be the whole. AdamW and clipping hide a factor of 2 in training, so it is checked here."""
    sharded = torch.load(two_ranks / ("lora_grads.pt" if lora else "grads.pt"))
    whole = whole_gradients(lora)
    assert_all_close(sharded, {n: g / 2 for n, g in whole.items()}, rtol=1e-5, atol=1e-7)
    if lora:  # the frozen base is sharded but has no gradient: only the factors train
        assert sharded and all("lora_" in name for name in sharded)


def test_fsdp_follows_the_loss_curve_and_weights_of_one_process(two_ranks, tmp_path):
    result = one_process(tmp_path)
    losses = [r["train_loss"] for r in result.history if "train_loss" in r]
    curve = torch.load(two_ranks / "straight" / "losses.pt")
    torch.testing.assert_close(curve, torch.tensor(losses, dtype=torch.float64), rtol=1e-6, atol=0)
    assert_all_close(
        torch.load(two_ranks / "straight" / "params.pt"),
        result.model.state_dict(),
        rtol=1e-5,
        atol=1e-6,
    )


def test_a_sharded_checkpoint_resumed_on_as_many_ranks_continues_bit_for_bit(two_ranks):
    straight = torch.load(two_ranks / "straight" / "params.pt")
    resumed = torch.load(two_ranks / "resumed" / "params.pt")
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(resumed[name], value) for name, value in straight.items())


def test_a_sharded_checkpoint_resumes_on_one_process_without_fsdp(two_ranks, tmp_path):
    """Two ranks' slices read whole into the plain model: the sums of the halves are now
    one sum, equal within float32 rounding (into FSDP over a group of one: the test of a
    rank that dies)."""
    shutil.copytree(two_ranks / "at_step_2", tmp_path / "run")
    result = one_process(tmp_path, resume=True, parallel="ddp")
    straight = torch.load(two_ranks / "straight" / "params.pt")
    assert_all_close(result.model.state_dict(), straight, rtol=1e-5, atol=1e-6)


def test_a_rank_that_dies_mid_run_leaves_the_last_checkpoint_loadable(two_ranks, tmp_path):
    run = two_ranks / "dies" / "run"
    assert load_trainer_state(RunFolder(run))["step"] == 2
    at_step_2 = load_pretrained(two_ranks / "at_step_2")
    assert_all_close(load_pretrained(run).state_dict(), at_step_2.state_dict(), rtol=0, atol=0)
    # And it trains on: resumed in one process, it ends where the unbroken run ended.
    shutil.copytree(run, tmp_path / "run")
    result = one_process(tmp_path, resume=True, parallel="fsdp")
    straight = torch.load(two_ranks / "straight" / "params.pt")
    assert_all_close(result.model.state_dict(), straight, rtol=1e-5, atol=1e-6)


def test_every_rank_refuses_a_run_folder_that_one_of_them_cannot_see(two_ranks):
    """Rank 1 looks for the run folder at another path, as a machine whose path is a local
    disk does: both ranks stop with the same sentence, before any work."""
    for rank in (0, 1):
        sentence = (two_ranks / f"refused-{rank}.txt").read_text()
        assert sentence.startswith("rank 1 on ") and "cannot see the run folder" in sentence
    assert not (two_ranks / "seen-by-rank-1").exists()
