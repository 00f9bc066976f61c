"""FSDP on two gloo ranks, for `test_parallel.py` to compare with one process.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m tests.train.fsdp_worker OUT

Each rank takes half of every global batch (`global_batches`). One launch does, in turn
(rank 0 writes the files, but the first):
  refused-R.txt            the sentence rank R stops with when rank 1's run folder is not
                           rank 0's (`check_shared_folder`)
  grads.pt, lora_grads.pt  every gradient after one backward, as FSDP reduced it, gathered
  straight/                a run of 4 steps, a checkpoint every 2: params.pt, losses.pt
  resumed/                 the same run stopped after step 2, then resumed: params.pt
  at_step_2/               a copy of that run folder as step 2 left it, to resume elsewhere
  dies/                    a run whose rank 1 is killed (SIGKILL) in step 3, after `dying`
The last ends the launch with a failure, as a machine lost mid-run does.
"""

import os
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from attnkit.errors import AttnkitError
from attnkit.train import Trainer, TrainResult
from attnkit.train import distributed as dist
from attnkit.train.objectives import objective_for
from attnkit.train.parallel import Parallel
from tests.helpers import global_batches, parallel_model, parallel_settings

STEPS = 4


def gradients(lora: bool, out: Path) -> None:
    """One forward and backward of this rank's half through the sharded model."""
    info = dist.from_env()
    model = parallel_model(lora)
    settings = parallel_settings(out.parent, parallel="fsdp")
    Parallel(settings, info, torch.device("cpu"), "fp32").shard(model)
    batch = global_batches(1, info.rank, info.world_size)[0]
    objective_for("encoder-decoder", settings.label_smoothing)(model, batch).total.backward()
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters() if p.requires_grad}
    if info.is_main:
        torch.save(grads, out)


def train(
    out: Path,
    steps: int,
    resume: bool = False,
    callbacks: Sequence[Callable[[dict[str, Any]], None]] = (),
) -> TrainResult:
    info = dist.from_env()
    result = Trainer(
        parallel_model(),
        global_batches(STEPS, info.rank, info.world_size),
        train=parallel_settings(out / "run", steps, parallel="fsdp"),
        callbacks=callbacks,
    ).fit(resume=resume)
    if info.is_main:
        torch.save({k: v.clone() for k, v in result.model.state_dict().items()}, out / "params.pt")
        losses = [r["train_loss"] for r in result.history if "train_loss" in r]
        torch.save(torch.tensor(losses, dtype=torch.float64), out / "losses.pt")
    return result


def die_in_step_3(info: dict[str, Any]) -> None:
    if dist.from_env().rank == 1 and info["step"] == 3:  # after the update, before a record
        os.kill(os.getpid(), signal.SIGKILL)


def main(out: Path) -> None:
    torch.set_num_threads(1)
    info = dist.setup("cpu")
    try:
        dist.check_shared_folder(out / f"seen-by-rank-{info.rank}")
    except AttnkitError as err:
        (out / f"refused-{info.rank}.txt").write_text(str(err))
    gradients(False, out / "grads.pt")
    gradients(True, out / "lora_grads.pt")
    train(out / "straight", STEPS)
    train(out / "resumed", 2)
    if info.is_main:  # the other rank waits in the resumed run's first collective meanwhile
        shutil.copytree(out / "resumed" / "run", out / "at_step_2")
    train(out / "resumed", STEPS, resume=True)
    if info.is_main:
        (out / "dying").touch()
    train(out / "dies", STEPS, callbacks=[die_in_step_3])
    dist.teardown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
