"""`attnkit train ...` as one rank of a torchrun job, failing if a rank but 0 trains a tokenizer.

    torchrun --nnodes=2 --nproc_per_node=1 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT \\
        -m tests.train.node_worker train CONFIG.toml

The command line is attnkit's own (`python -m attnkit`); the other ranks must load the
tokenizer rank 0 wrote into the run folder.
"""

import runpy
import sys

from attnkit.tokenizer import Tokenizer
from attnkit.train import distributed as dist


def refuse(*args, **kwargs):
    raise AssertionError(f"rank {dist.from_env().rank} trained a tokenizer; only rank 0 may")


if __name__ == "__main__":
    if not dist.from_env().is_main:
        Tokenizer.train = classmethod(refuse)
    sys.argv = ["attnkit", *sys.argv[1:]]
    runpy.run_module("attnkit", run_name="__main__", alter_sys=True)
