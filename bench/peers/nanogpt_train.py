"""nanoGPT's Tiny Shakespeare recipes as its users run them: one file, one training loop.

Two recipes of nanoGPT's README, both on characters with a 90/10 split, AdamW
with betas (0.9, 0.99) and weight decay 0.1 on the matrices only, gradients
clipped at norm 1, a learning rate of 1e-3 after 100 warm-up iterations with
cosine decay to 1e-4, and every 250 iterations the loss of `eval_batches`
batches of each split (a checkpoint when the validation loss improves):

    cpu   4 layers, 4 heads, d_model 128, block 64, batch 12, 2,000 iterations,
          no dropout, float32, eager, 20 evaluation batches, a log line every iteration
    gpu   6 layers, 6 heads, d_model 384, block 256, batch 64, 5,000 iterations,
          dropout 0.2, bf16 autocast, torch.compile, fused AdamW, 200 evaluation
          batches, the loss read back every 10 iterations (nanoGPT's log_interval)

The text is first encoded to uint16 files and every batch is cut at random
offsets from a fresh memory map of them, as nanoGPT does; on a GPU the batch
is pinned and copied without blocking while the step before still runs.
Written from that description for `bench/bench_recipe.py` and
`bench/train_gpu.py`; nothing of attnkit inside.

    python -m bench.peers.nanogpt_train --input ../shared/data/tinyshakespeare/input.txt
    python -m bench.peers.nanogpt_train --recipe gpu --input .../input.txt
"""

from __future__ import annotations

import argparse
import contextlib
import math
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bench.peers.nanogpt import NanoGPT

LR, MIN_LR, WARMUP = 1e-3, 1e-4, 100
EVAL_EVERY = 250


@dataclass(frozen=True)
class Recipe:
    block: int
    batch: int
    layers: int
    heads: int
    d: int
    iters: int
    dropout: float
    eval_batches: int
    log_interval: int  # iterations between the loss read back to the host
    device: str
    fast: bool  # bf16 autocast, torch.compile and the fused AdamW (nanoGPT's GPU settings)

    @property
    def tokens(self) -> int:
        return self.block * self.batch


RECIPES = {
    "cpu": Recipe(64, 12, 4, 4, 128, 2000, 0.0, 20, 1, "cpu", False),
    "gpu": Recipe(256, 64, 6, 6, 384, 5000, 0.2, 200, 10, "cuda", True),
}


def encode(text_file: Path, out: Path) -> int:
    """Write train.bin and val.bin (uint16 character ids); return the vocabulary size."""
    text = text_file.read_text(encoding="utf-8")
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = np.array([index[c] for c in text], dtype=np.uint16)
    cut = int(0.9 * len(ids))
    ids[:cut].tofile(out / "train.bin")
    ids[cut:].tofile(out / "val.bin")
    return len(chars)


def batch(out: Path, split: str, recipe: Recipe) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of `recipe.batch` windows at random offsets of `split`."""
    data = np.memmap(out / f"{split}.bin", dtype=np.uint16, mode="r")
    starts = torch.randint(len(data) - recipe.block, (recipe.batch,)).tolist()
    x = torch.stack([torch.from_numpy(data[i : i + recipe.block].astype(np.int64)) for i in starts])
    y = torch.stack(
        [torch.from_numpy(data[i + 1 : i + 1 + recipe.block].astype(np.int64)) for i in starts]
    )
    if recipe.device == "cuda":
        return x.pin_memory().to("cuda", non_blocking=True), y.pin_memory().to(
            "cuda", non_blocking=True
        )
    return x, y


def learning_rate(step: int, iters: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / (WARMUP + 1)
    progress = min(1.0, (step - WARMUP) / max(1, iters - WARMUP))
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * progress)) * (LR - MIN_LR)


def autocast(recipe: Recipe) -> contextlib.AbstractContextManager:
    if recipe.fast:
        return torch.autocast(recipe.device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def estimate_loss(model: torch.nn.Module, out: Path, recipe: Recipe) -> dict[str, float]:
    model.eval()
    losses = {}
    for split in ("train", "val"):
        total = torch.zeros((), device=recipe.device)
        for _ in range(recipe.eval_batches):
            with autocast(recipe):
                total += model(*batch(out, split, recipe))
        losses[split] = total.item() / recipe.eval_batches
    model.train()
    return losses


def build(vocab: int, recipe: Recipe) -> tuple[NanoGPT, torch.optim.AdamW]:
    """The model (nanoGPT's initialisation, no biases) and its optimizer."""
    model = NanoGPT(
        vocab,
        recipe.block,
        recipe.layers,
        recipe.heads,
        recipe.d,
        bias=False,
        nanogpt_init=True,
        dropout=recipe.dropout,
    ).to(recipe.device)
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.99), fused=recipe.fast)
    return model, optimizer


def iterations(
    model: NanoGPT,
    optimizer: torch.optim.AdamW,
    out: Path,
    recipe: Recipe,
    iters: int,
    evaluate: Callable[[int], None] = lambda step: None,
) -> Iterator[tuple[int, float | None]]:
    """nanoGPT's loop; yields (iteration, loss read back or None) after each iteration."""
    step_model = torch.compile(model) if recipe.fast else model
    x, y = batch(out, "train", recipe)
    for step in range(iters + 1):  # nanoGPT runs iterations 0 to max_iters
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, iters)
        evaluate(step)
        with autocast(recipe):
            loss = step_model(x, y)
        x, y = batch(out, "train", recipe)  # the next batch, while a GPU is still busy
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        yield step, loss.item() if step % recipe.log_interval == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, required=True, help="the Tiny Shakespeare text")
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="cpu")
    parser.add_argument("--iters", type=int, default=None, help="default: the recipe's")
    args = parser.parse_args()
    recipe = RECIPES[args.recipe]
    iters = args.iters if args.iters is not None else recipe.iters
    if recipe.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(1337)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        model, optimizer = build(encode(args.input, out), recipe)
        best, last = math.inf, {}

        def evaluate(step: int) -> None:
            nonlocal best, last
            if step % EVAL_EVERY:
                return
            last = estimate_loss(model, out, recipe)
            print(f"step {step}: train loss {last['train']:.4f}, val loss {last['val']:.4f}")
            if last["val"] < best:
                best = last["val"]
                if step > 0:
                    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                    torch.save(state, out / "ckpt.pt")

        start = time.perf_counter()
        for step, loss in iterations(model, optimizer, out, recipe, iters, evaluate):
            if loss is not None:
                took = (time.perf_counter() - start) * 1e3 / recipe.log_interval
                print(f"iter {step}: loss {loss:.4f}, time {took:.2f}ms", flush=True)
                start = time.perf_counter()
        print(f"best val loss {best:.4f}")
        print(f"final val loss {last['val']:.4f}")


if __name__ == "__main__":
    main()
