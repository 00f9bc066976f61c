"""torch.compile per Block under FSDP2 on two gloo ranks, for `test_parallel_compile.py`.

    python -m torch.distributed.run --standalone --nproc_per_node=2 \
        -m tests.train.compile_worker OUT

Rank 0 writes OUT/report.pt: the losses of two steps of a small Llama-shaped model sharded
over the two ranks, eager and with each Block compiled (inductor on the CPU), the graphs
torch.compile made, whether every Block was compiled in place, and the saved weights' names.
"""

import os
import sys
from pathlib import Path

# Inductor compiles in this process rather than starting a pool of compiler processes: on a
# CPU shared by the two ranks and the test suite, the pool costs more than it saves.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch
from torch._dynamo.utils import counters

from attnkit.config import ModelConfig
from attnkit.data.batch import Batch
from attnkit.models import build_model
from attnkit.models.block import Block
from attnkit.train import Trainer
from attnkit.train import distributed as dist
from attnkit.train.run_config import TrainSection

CONFIG = ModelConfig.from_preset(
    "llama-tiny", n_decoder_layers=2, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, vocab_size=64
)


def run(out: Path, compiled: bool, rank: int) -> tuple[list[float], Trainer]:
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(5, 64, (2, 2, 8), generator=g)
    batches = [Batch(tgt=t, tgt_mask=torch.ones_like(t, dtype=torch.bool)) for t in ids]
    settings = TrainSection(
        out_dir=str(out), steps=2, lr=1e-3, schedule="constant", warmup=0, log_every=1,
        save_every=100, device="cpu", parallel="fsdp", threads=1, compile=compiled,
        compile_scope="block", compile_mode="default",
    )  # fmt: skip
    torch.manual_seed(0)
    trainer = Trainer(build_model(CONFIG), batches, train=settings)
    result = trainer.fit()
    return [r["train_loss"] for r in result.history if "train_loss" in r], trainer


def main(out: Path) -> None:
    info = dist.setup("cpu")
    eager, _ = run(out / "eager", False, info.rank)
    compiled, trainer = run(out / "compiled", True, info.rank)
    blocks = [m for m in trainer.model.modules() if isinstance(m, Block)]
    if info.is_main:
        torch.save(
            {
                "eager": eager,
                "compiled": compiled,
                "graphs": counters["stats"]["unique_graphs"],
                "blocks_compiled": all(b._compiled_call_impl is not None for b in blocks),
                "blocks": len(blocks),
                "keys": list(trainer.model.state_dict()),
            },
            out / "report.pt",
        )
    dist.teardown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
