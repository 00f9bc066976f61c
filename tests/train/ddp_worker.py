"""Train a tiny model on a fixed global batch, alone or as one rank under torchrun.

    python ddp_worker.py OUT_DIR                                   one process, whole batches
    python -m torch.distributed.run --nproc_per_node=2 ddp_worker.py OUT_DIR   each rank a half

Rank 0 (or the lone process) saves the final parameters to OUT_DIR/params.pt.

Under torchrun each rank then trains again with the rate decaying over a budget of two
seconds, and saves its own parameters to OUT_DIR/budgeted{rank}.pt: equal only if the ranks
set equal rates. Ranks' clocks differ a little by themselves (they start at different
moments); here rank r's `time.perf_counter` also runs r + 1 times as fast as real time, so
that a rate set by any one rank's clock would differ by far.
"""

import sys
import time
from pathlib import Path

import torch
from torch import nn

from attnkit.data.batch import Batch
from attnkit.train import Trainer
from attnkit.train import distributed as dist
from tests.helpers import global_batches, parallel_model, parallel_settings

STEPS = 4


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def train_on_skewed_clocks(out: Path, data: list[Batch], rank: int) -> nn.Module:
    settings = parallel_settings(
        out / "budgeted",
        100_000,  # a cap the budget ends long before
        schedule="linear",
        decay_over="minutes",
        max_minutes=2 / 60,
        save_every=100_000,
    )
    real = time.perf_counter
    time.perf_counter = lambda: (rank + 1) * real()
    try:
        return Trainer(parallel_model(), data, train=settings).fit().model
    finally:
        time.perf_counter = real


def main(out: Path) -> None:
    torch.set_num_threads(1)
    info = dist.from_env()
    data = global_batches(STEPS, info.rank, info.world_size)
    result = Trainer(parallel_model(), data, train=parallel_settings(out / "run", STEPS)).fit()
    if info.is_main:
        torch.save(params(result.model), out / "params.pt")
    if info.active:
        budgeted = train_on_skewed_clocks(out, data, info.rank)
        torch.save(params(budgeted), out / f"budgeted{info.rank}.pt")
    dist.teardown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
