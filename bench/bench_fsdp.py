"""FSDP and activation checkpointing on one GPU: peak memory and tokens/s (issue 41, item 6).

    python -m bench fsdp                          # on one CUDA GPU, a table last (under 90 s)
    python -m bench fsdp --device cpu --tiny      # the same path on the CPU, as a check

NCCL needs two GPUs to shard anything; on one, FSDP runs over a group of one: the same code
(`attnkit.train.parallel`), weights gathered in bf16, float32 masters, with nothing to
divide. Four runs of one Llama-shaped decoder (0.70B parameters, 12 Blocks) on random
tokens, each a fresh model: one process without FSDP, then FSDP with activation
checkpointing `none`, `block` and `selective` (`attnkit.train.activation_checkpointing`).
A step is what the Trainer's is: forward and backward under bf16 autocast, the mean over the
tokens, clipping, fused AdamW. Peak memory is `torch.cuda.max_memory_allocated` over the
steps; tokens/s is over the steps after the first two. Beside each peak, the estimate of
`bench/memory_plan.py` for the same model and plan (the formulas of
docs/explanation/memory.md), so the paper table is checked where a GPU can hold the model.
"""

from __future__ import annotations

import argparse
import contextlib
import time
import weakref

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from attnkit.data.batch import Batch
from attnkit.interop.llama import config_from_hf
from attnkit.models import build_model
from attnkit.train import distributed as dist
from attnkit.train.activation_checkpointing import apply_activation_checkpointing
from attnkit.train.objectives import objective_for
from attnkit.train.optim import build_optimizer
from attnkit.train.parallel import Parallel
from attnkit.train.run_config import TrainSection
from bench.harness import opening
from bench.memory_plan import GB, Plan, count, measure_activations, per_gpu

# Llama-shaped, heads of 128 as Llama's: 0.70B parameters, big enough that its activations
# (about 11 GB at 4 x 2048 tokens in bf16) and its training state (about 11 GB) both show.
MODEL = {
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "intermediate_size": 5632,
    "num_hidden_layers": 12,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
}
# The CPU check's: small, with heads to spare for `memory_plan`'s widths of 1/8 and 1/4.
TINY = {**MODEL, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8}
TINY |= {"intermediate_size": 1376, "num_hidden_layers": 2, "vocab_size": 256}


class PeakTensorBytes(TorchDispatchMode):
    """The most bytes of tensor storage alive at once among those the ops it sees made
    (activations, gradients, recomputed values), counted as torch allocates and frees them."""

    def __init__(self) -> None:
        super().__init__()
        self.alive: dict[int, int] = {}
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            # A DTensor holds no storage; the local tensors under it are made by ops too.
            if isinstance(tensor, torch.Tensor) and not isinstance(tensor, DTensor):
                storage = tensor.untyped_storage()
                if id(storage) not in self.alive:
                    self.alive[id(storage)] = storage.nbytes()
                    self.now += storage.nbytes()
                    self.peak = max(self.peak, self.now)
                    weakref.finalize(storage, self._freed, id(storage))
        return out

    def _freed(self, key: int) -> None:
        self.now -= self.alive.pop(key)


RUNS = [("ddp", "none"), ("fsdp", "none"), ("fsdp", "block"), ("fsdp", "selective")]


def train_steps(
    hf: dict, parallel: str, checkpointing: str, device: torch.device, batch: Batch, steps: int
) -> tuple[float, float]:
    """Peak bytes and tokens/s of `steps` training steps of a fresh model. On the CPU, which
    keeps no count, the peak is `PeakTensorBytes`' (and its tokens/s is slowed by it)."""
    precision = "bf16" if device.type == "cuda" else "fp32"
    settings = TrainSection(parallel=parallel, device=device.type, precision=precision)
    info = dist.setup(device.type, alone=parallel == "fsdp")
    torch.manual_seed(0)
    model = build_model(config_from_hf(hf)).to(device)
    apply_activation_checkpointing(model, checkpointing)
    Parallel(settings, info, device, precision).shard(model)  # as the Trainer does
    optimizer = build_optimizer(model, 1e-4, 0.1)
    objective = objective_for("decoder")
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    tokens = batch.tgt.numel()
    tracker = PeakTensorBytes() if device.type == "cpu" else contextlib.nullcontext()
    with tracker:
        seconds = _steps(model, optimizer, objective, batch, precision, device, steps)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:  # what the steps made, the weights made before, AdamW's moments of sharded weights
        moments = [t for state in optimizer.state.values() for t in state.values()]
        peak = tracker.peak + _local_bytes(model.parameters())
        peak += _local_bytes(t for t in moments if isinstance(t, DTensor))
    del model, optimizer
    dist.teardown()
    return peak, tokens * (steps - 2) / seconds


def _local_bytes(tensors) -> int:
    return sum((t.to_local() if isinstance(t, DTensor) else t).nbytes for t in tensors)


def _steps(model, optimizer, objective, batch, precision, device, steps) -> float:
    """Seconds of the training steps after the first two."""
    tokens = batch.tgt.numel()
    for step in range(steps):
        if step == 2:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            terms = objective(model, batch)
        terms.total.backward()
        params = [p for p in model.parameters() if p.grad is not None]
        torch._foreach_mul_([p.grad for p in params], 1 / tokens)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="a 2-Block model (a check on CPU)")
    parser.add_argument("--batch", type=int, default=4, help="sequences a step")
    parser.add_argument("--length", type=int, default=2048, help="tokens a sequence")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    hf = TINY if args.tiny else MODEL
    if args.tiny:  # enough tokens that the activations outweigh the weights
        args.batch, args.length, args.steps = 8, 256, 3
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "no GPU"
    opening(f"{gpu}", f"{args.batch} x {args.length} tokens a step", f"{args.steps} steps")
    ids = torch.randint(5, hf["vocab_size"], (args.batch, args.length + 1))
    batch = Batch(None, None, ids, torch.ones_like(ids, dtype=torch.bool)).to(device)
    counts, acts = count(hf), measure_activations(hf)
    precision = "bf16" if device.type == "cuda" else "fp32"
    rows = []
    for parallel, checkpointing in RUNS:
        peak, speed = train_steps(hf, parallel, checkpointing, device, batch, args.steps)
        plan = Plan(parallel, checkpointing, False, precision)
        estimate = per_gpu(counts, acts[precision], plan, 1, args.batch * args.length)
        rows.append((parallel, checkpointing, peak / GB, estimate / GB, speed))
        print(
            f"{parallel} {checkpointing}: peak {peak / GB:.3f} GB, {speed:,.0f} tokens/s",
            flush=True,
        )
    base = rows[0][4]
    print(f"\n{counts.params / 1e9:.2f}B parameters, {precision}, one device\n")
    print("| parallel | activation checkpointing | peak GB | estimate GB | tokens/s | vs first |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for parallel, checkpointing, peak, estimate, speed in rows:
        # The paper formulas know no `selective`: what it keeps depends on the ops.
        guess = "" if checkpointing == "selective" else f"{estimate:.3f}"
        print(
            f"| {parallel} | {checkpointing} | {peak:.3f} | {guess} | {speed:,.0f} | "
            f"{speed / base:.2f}x |"
        )


if __name__ == "__main__":
    main()
