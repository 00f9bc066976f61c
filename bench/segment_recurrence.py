"""Segment recurrence (Transformer-XL) against a sliding window, at equal compute, on Tiny
Shakespeare: validation loss per character.

    python -m bench segment-recurrence --steps 400 --seeds 1
    python -m bench segment-recurrence --steps 400 --recurrence-steps 630   # equal seconds

The same character-level decoder (2 layers, d_model 64, 4 heads, d_ff 256, RoPE, no dropout)
is trained from scratch two ways, AdamW at lr 2e-3, batch 8, each step running 64 positions a
row through every layer:

- window: blocks of 64 characters at random offsets, attention within a sliding window of 32
  (`attention_window`, the ring cache's shape when decoding);
- recurrence: the training text cut into 8 streams read 32 characters a step, each segment
  attending to the 32 before it through the memory of every layer (mem_len 32,
  `attnkit.models.segment_memory`; a layer runs on memory and segment together, 64 rows).

So each step costs the same (64 rows a layer, a 64 x 64 causal score matrix); the window
learns from 64 predictions a row a step, the recurrence from 32. Validation: the first
16,384 characters of the 10% validation split, the window model in blocks of 128 (every
position past the 32nd with a full window), the recurrent one as 8 streams of segments.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnkit.config import ModelConfig
from attnkit.files import read_lines
from attnkit.models import build_model
from attnkit.models.segment_memory import forward_segment
from bench.harness import Result, finish, opening

SEGMENT, WINDOW, BATCH, VALID = 32, 32, 8, 16_384


def model(vocab: int, window: int) -> torch.nn.Module:
    config = ModelConfig(
        shape="decoder", vocab_size=vocab, d_model=64, n_heads=4, d_ff=256, n_decoder_layers=2,
        positional="rope", max_len=128, dropout=0.0, embedding_dropout=0.0, norm_position="pre",
        tie_embeddings="decoder", attention_window=window,
    )  # fmt: skip
    return build_model(config)


def streams(ids: torch.Tensor, n: int) -> torch.Tensor:
    length = len(ids) // n
    return ids[: n * length].view(n, length)


def train_window(train: torch.Tensor, vocab: int, steps: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    net = model(vocab, WINDOW)
    optimizer = torch.optim.AdamW(net.parameters(), lr=2e-3)
    for _ in range(steps):
        starts = torch.randint(len(train) - 2 * SEGMENT - 1, (BATCH,))
        rows = torch.stack([train[s : s + 2 * SEGMENT + 1] for s in starts.tolist()])
        logits = net(rows[:, :-1]).logits
        loss = F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return net


def train_recurrent(train: torch.Tensor, vocab: int, steps: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    net = model(vocab, 0)
    optimizer = torch.optim.AdamW(net.parameters(), lr=2e-3)
    text = streams(train, BATCH)
    memory, at = None, int(torch.randint(text.shape[1] // 2, ()))  # a seeded place to start
    for _ in range(steps):
        if at + SEGMENT + 1 > text.shape[1]:
            memory, at = None, 0
        rows = text[:, at : at + SEGMENT + 1]
        out, memory = forward_segment(net, rows[:, :-1], memory, SEGMENT)
        loss = F.cross_entropy(out.logits.flatten(0, 1), rows[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        at += SEGMENT
    return net


@torch.no_grad()
def valid_window(net: torch.nn.Module, valid: torch.Tensor) -> float:
    rows = valid[: (len(valid) - 1) // 128 * 128 + 1]
    inputs, targets = rows[:-1].view(-1, 128), rows[1:].view(-1, 128)
    return float(F.cross_entropy(net.eval()(inputs).logits.flatten(0, 1), targets.flatten()))


@torch.no_grad()
def valid_recurrent(net: torch.nn.Module, valid: torch.Tensor) -> float:
    text, memory, losses = streams(valid, BATCH), None, []
    for at in range(0, text.shape[1] - SEGMENT, SEGMENT):
        rows = text[:, at : at + SEGMENT + 1]
        out, memory = forward_segment(net.eval(), rows[:, :-1], memory, SEGMENT)
        losses.append(float(F.cross_entropy(out.logits.flatten(0, 1), rows[:, 1:].flatten())))
    return statistics.mean(losses)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench segment-recurrence", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument(
        "--recurrence-steps", type=int, help="the recurrent model's steps (default --steps)"
    )
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    text = "\n".join(read_lines(args.data_dir / "tinyshakespeare" / "input.txt"))
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])
    cut = int(len(ids) * 0.9)
    train, valid = ids[:cut], ids[cut : cut + VALID + 1]
    header = opening(
        f"{args.steps} steps, batch {BATCH}, {args.seeds} seeds, {args.threads} threads"
    )
    losses: dict[str, list[float]] = {"window": [], "recurrence": []}
    seconds: dict[str, list[float]] = {"window": [], "recurrence": []}
    for seed in range(args.seeds):
        start = time.perf_counter()
        net = train_window(train, len(chars), args.steps, seed)
        seconds["window"].append(time.perf_counter() - start)
        losses["window"].append(valid_window(net, valid))
        start = time.perf_counter()
        net = train_recurrent(train, len(chars), args.recurrence_steps or args.steps, seed)
        seconds["recurrence"].append(time.perf_counter() - start)
        losses["recurrence"].append(valid_recurrent(net, valid))
    results = [
        Result(
            "validation loss: recurrence vs window 32", "nats per char", losses["recurrence"],
            losses["window"], "window", higher_is_better=False,
            extra={"perplexity": f"{math.exp(statistics.mean(losses['recurrence'])):.2f} vs "
                   f"{math.exp(statistics.mean(losses['window'])):.2f}"},
        ),
        Result(
            "training seconds: recurrence vs window 32", "s", seconds["recurrence"],
            seconds["window"], "window", higher_is_better=False,
        ),
    ]  # fmt: skip
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
