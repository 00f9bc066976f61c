"""The built-in demo: learn to reverse digit strings, the copy task's harder cousin.

The task is generated in code, so the demo needs no data and proves the whole
pipeline (embeddings, positions, masks, cross-attention, training, greedy
decoding) in about a minute on a CPU. Reversal forces the decoder's
cross-attention to learn an anti-diagonal alignment, which the heat map shows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnkit.config import ModelConfig
from attnkit.data.batch import Batch, pad
from attnkit.models import EncoderDecoder, TransformerModel
from attnkit.train import TrainResult
from attnkit.train import distributed as dist
from attnkit.train.run_config import RunConfig, apply_overrides
from attnkit.train.tasks import TaskSetup
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


# The demo's run config; configs/demo.toml holds the same values (a test keeps them equal).
DEMO_RUN = {
    "model": {"preset": "demo"},
    "data": {"task": "reverse", "max_len": 12, "batch_size": 64},
    "train": {
        "out_dir": "attnkit-demo/run",
        "steps": 1500,
        "lr": 2e-3,
        "schedule": "linear",
        "warmup": 100,
        "weight_decay": 0.0,
        "beta2": 0.999,
        "eps": 1e-8,
        "clip_norm": 1.0,
        "label_smoothing": 0.0,
        "log_every": 50,
        "save_every": 1500,
        "keep_last": 1,
        # A model this small runs fastest on one thread; more threads only contend.
        "threads": 1,
    },
    "eval": {"every": 500, "metric": "exact_match", "decode_examples": 200},
}


def demo_run_config(**overrides: Any) -> RunConfig:
    """The demo's RunConfig; `overrides` are `section.key` names, e.g. {"train.steps": 300}."""
    return RunConfig.from_dict(
        apply_overrides(
            DEMO_RUN,
            [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in overrides.items()],
        )
    )


class ReverseBatches:
    """`batches_per_epoch` random batches per epoch, the same for the same (seed, epoch)."""

    def __init__(
        self, task: ReverseTask, batch_size: int, seed: int, batches_per_epoch: int = 500
    ) -> None:
        self.task, self.batch_size, self.seed = task, batch_size, seed
        self.batches_per_epoch = batches_per_epoch
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.batches_per_epoch

    def __iter__(self) -> Iterator[Batch]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        for _ in range(self.batches_per_epoch):
            yield self.task.batch(self.task.sample(self.batch_size, generator))


def reverse_setup(config: RunConfig) -> TaskSetup:
    """Model, data and the exact-match metric of the reversal task, from a run config.

    `data.max_len` is the longest digit string; each rank draws its own batches.
    """
    task = ReverseTask(max_len=config.data.max_len)
    model_config = config.model.build(vocab_size=len(VOCAB))
    torch.manual_seed(config.train.seed)
    model = EncoderDecoder(model_config)
    rank = dist.from_env().rank
    train = ReverseBatches(task, config.data.batch_size, seed=config.train.seed * 100 + rank)
    n, seed = config.eval.decode_examples, config.train.seed + 1

    def metric(m: TransformerModel) -> dict[str, float]:
        return {"exact_match": exact_match(m, task, n, seed=seed)[0]}

    return TaskSetup(model, train, None, [metric], None)


def train_reverser(
    config: RunConfig | None = None,
    *,
    callbacks: Sequence[Callable[[dict[str, Any]], None]] = (),
) -> TrainResult:
    """Train the demo model with the `Trainer`; the run folder is `train.out_dir`."""
    from attnkit.train.tasks import train

    return train(config or demo_run_config(), callbacks=callbacks)


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
