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
from attnkit.train.run_config import TrainSection
from tests.helpers import global_batches, tiny_model

STEPS = 4


def main(out: Path) -> None:
    torch.set_num_threads(1)
    info = dist.from_env()
    data = global_batches(STEPS, info.rank, info.world_size)
    model = tiny_model(dropout=0.0, embedding_dropout=0.0, bias=False)
    settings = TrainSection(
        out_dir=str(out / "run"),
        steps=STEPS,
        lr=3e-3,
        schedule="constant",
        warmup=0,
        weight_decay=0.1,
        label_smoothing=0.1,
        device="cpu",
    )
    result = Trainer(model, data, train=settings).fit()
    if info.is_main:
        torch.save({k: v.clone() for k, v in result.model.state_dict().items()}, out / "params.pt")
    dist.teardown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
