"""Train a tiny model on a fixed global batch, alone or as one rank under torchrun.

    python ddp_worker.py OUT_DIR                                   one process, whole batches
    python -m torch.distributed.run --nproc_per_node=2 ddp_worker.py OUT_DIR   each rank a half

Rank 0 (or the lone process) saves the final parameters to OUT_DIR/params.pt.
"""

import sys
from pathlib import Path

import torch

from attnkit.train import Trainer
from attnkit.train import distributed as dist
from tests.helpers import global_batches, parallel_model, parallel_settings

STEPS = 4


def main(out: Path) -> None:
    torch.set_num_threads(1)
    info = dist.from_env()
    data = global_batches(STEPS, info.rank, info.world_size)
    settings = parallel_settings(out / "run", STEPS)
    result = Trainer(parallel_model(), data, train=settings).fit()
    if info.is_main:
        torch.save({k: v.clone() for k, v in result.model.state_dict().items()}, out / "params.pt")
    dist.teardown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
