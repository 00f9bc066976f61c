"""nanoGPT's Tiny Shakespeare CPU recipe as its users run it: one file, one training loop.

The recipe of nanoGPT's README for a CPU: characters, 4 layers, 4 heads,
d_model 128, block 64, batch 12, 2,000 iterations, no dropout, no biases;
learning rate 1e-3 after 100 warm-up iterations, cosine decay to 1e-4 at
2,000; AdamW with betas (0.9, 0.99) and weight decay 0.1 on the matrices only;
gradients clipped at norm 1; every 250 iterations the loss of 20 batches of
each split, and a checkpoint when the validation loss improves; a log line
every iteration. The text is first encoded to uint16 files (90/10 split) and
every batch is cut from a fresh memory map of them, as nanoGPT does. Written
from that description for `bench/bench_recipe.py`; nothing of attnkit inside.

    python -m bench.peers.nanogpt_train --input ../shared/data/tinyshakespeare/input.txt
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.peers.nanogpt import NanoGPT

BLOCK, BATCH, LAYERS, HEADS, D = 64, 12, 4, 4, 128
LR, MIN_LR, WARMUP = 1e-3, 1e-4, 100
EVAL_EVERY, EVAL_BATCHES = 250, 20


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


def batch(out: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = np.memmap(out / f"{split}.bin", dtype=np.uint16, mode="r")
    starts = torch.randint(len(data) - BLOCK, (BATCH,)).tolist()
    x = torch.stack([torch.from_numpy(data[i : i + BLOCK].astype(np.int64)) for i in starts])
    y = torch.stack(
        [torch.from_numpy(data[i + 1 : i + 1 + BLOCK].astype(np.int64)) for i in starts]
    )
    return x, y


def learning_rate(step: int, iters: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / (WARMUP + 1)
    progress = min(1.0, (step - WARMUP) / max(1, iters - WARMUP))
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * progress)) * (LR - MIN_LR)


@torch.no_grad()
def estimate_loss(model: NanoGPT, out: Path) -> dict[str, float]:
    model.eval()
    losses = {
        s: sum(model(*batch(out, s)).item() for _ in range(EVAL_BATCHES)) for s in ("train", "val")
    }
    model.train()
    return {s: total / EVAL_BATCHES for s, total in losses.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, required=True, help="the Tiny Shakespeare text")
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args()
    torch.manual_seed(1337)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        model = NanoGPT(
            encode(args.input, out), BLOCK, LAYERS, HEADS, D, bias=False, nanogpt_init=True
        )
        params = list(model.parameters())
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        optimizer = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.99))
        best = math.inf
        x, y = batch(out, "train")
        for step in range(args.iters + 1):  # nanoGPT runs iterations 0 to max_iters
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, args.iters)
            if step % EVAL_EVERY == 0:
                losses = estimate_loss(model, out)
                print(
                    f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
                )
                if losses["val"] < best:
                    best = losses["val"]
                    if step > 0:
                        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                        torch.save(state, out / "ckpt.pt")
            start = time.perf_counter()
            loss = model(x, y)
            x, y = batch(out, "train")  # the next batch, while nanoGPT's GPU would be busy
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            took = (time.perf_counter() - start) * 1e3
            print(f"iter {step}: loss {loss.item():.4f}, time {took:.2f}ms")
        print(f"final val loss {losses['val']:.4f}")


if __name__ == "__main__":
    main()
