"""The built-in demo: learn to reverse digit strings, the copy task's harder cousin.

The task is generated in code, so the demo needs no data and proves the whole
pipeline (embeddings, positions, masks, cross-attention, training, greedy
decoding) in about a minute on a CPU. Reversal forces the decoder's
cross-attention to learn an anti-diagonal alignment, which the heat map shows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.config import ModelConfig
from attnkit.data.batch import Batch, pad
from attnkit.models import EncoderDecoder
from attnkit.viz import plot_attention

log = logging.getLogger(__name__)

PAD, BOS, EOS = 0, 1, 2
DIGIT0 = 4  # ids 4..13 are the digits 0..9; 3 is left for <unk> as in every attnkit vocabulary
VOCAB = ["<pad>", "<s>", "</s>", "<unk>", *"0123456789"]


@dataclass(frozen=True)
class ReverseTask:
    """Source: random digits; target: the same digits reversed."""

    min_len: int = 4
    max_len: int = 12

    def sample(self, n: int, generator: torch.Generator) -> list[tuple[list[int], list[int]]]:
        lengths = torch.randint(self.min_len, self.max_len + 1, (n,), generator=generator)
        pairs = []
        for length in lengths.tolist():
            digits = (torch.randint(0, 10, (length,), generator=generator) + DIGIT0).tolist()
            pairs.append((digits, digits[::-1]))
        return pairs

    def batch(self, pairs: list[tuple[list[int], list[int]]]) -> Batch:
        src, src_mask = pad([s for s, _ in pairs], PAD)
        tgt, tgt_mask = pad([[BOS, *t, EOS] for _, t in pairs], PAD)
        return Batch(src, src_mask, tgt, tgt_mask)


def demo_config() -> ModelConfig:
    return ModelConfig.from_preset("demo", vocab_size=len(VOCAB))


def train_reverser(
    steps: int = 1500,
    batch_size: int = 64,
    lr: float = 2e-3,
    warmup: int = 100,
    task: ReverseTask | None = None,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> EncoderDecoder:
    """Train the demo model with teacher forcing and a linear-warmup, linear-decay Adam."""
    task = task or ReverseTask()
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = EncoderDecoder(demo_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / (steps - warmup)))
    )
    model.train()
    for step in range(steps):
        b = task.batch(task.sample(batch_size, generator))
        logits = model(b.src, b.tgt[:, :-1], b.src_mask, b.tgt_mask[:, :-1]).logits
        loss = F.cross_entropy(logits.flatten(0, 1), b.tgt[:, 1:].flatten(), ignore_index=PAD)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if on_step is not None:
            on_step(step, loss.item())
    return model.eval()


@torch.no_grad()
def greedy_decode(
    model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_new_tokens: int
) -> Tensor:
    """argmax decoding, one position at a time; rows stop growing after </s>."""
    memory = model.encode(src, src_mask)
    out = torch.full((src.shape[0], 1), BOS, dtype=torch.long)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_new_tokens):
        next_ids = model.decode(out, memory, src_mask)[:, -1].argmax(-1)
        next_ids = next_ids.masked_fill(done, PAD)
        out = torch.cat([out, next_ids[:, None]], dim=1)
        done |= next_ids == EOS
        if done.all():
            break
    return out[:, 1:]


def strip(ids: list[int]) -> list[int]:
    """Tokens before the first </s> (or <pad>)."""
    for i, t in enumerate(ids):
        if t in (EOS, PAD):
            return ids[:i]
    return ids


def exact_match(model: EncoderDecoder, task: ReverseTask, n: int, seed: int) -> tuple[float, list]:
    """Share of held-out sources reversed perfectly, and the examples."""
    pairs = task.sample(n, torch.Generator().manual_seed(seed))
    b = task.batch(pairs)
    hyps = greedy_decode(model, b.src, b.src_mask, task.max_len + 1).tolist()
    results = [(s, t, strip(h)) for (s, t), h in zip(pairs, hyps, strict=True)]
    return sum(t == h for _, t, h in results) / n, results


def show(ids: list[int]) -> str:
    return "".join(VOCAB[i] if i < len(VOCAB) else "?" for i in ids)


def attention_picture(model: EncoderDecoder, digits: list[int], path: Path) -> Path:
    """Cross-attention of every decoder layer, averaged over heads, for one example."""
    src = torch.tensor([digits])
    tgt = torch.tensor([[BOS, *digits[::-1]]])
    with torch.no_grad():
        out = model(src, tgt, need_weights=True)
    layers = [w[0].mean(0) for w in out.attentions["cross"]]
    return plot_attention(
        layers,
        path,
        queries=["<s>", *show(digits[::-1])],
        keys=list(show(digits)),
        titles=[f"decoder layer {i + 1}, mean of heads" for i in range(len(layers))],
        suptitle="cross-attention learns to read the source backwards",
    )
