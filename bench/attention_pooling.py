"""Attention pooling against mean pooling, trained in a sentence classification.

    python -m bench attention-pooling --steps 300 --seeds 2

The task, from Multi30k's English captions: does the caption mention a dog ("dog" or
"dogs")? Train and validation sets take every such caption of their split and as many
others drawn at random (balanced, so chance is 50%). The same tiny encoder (1 layer,
d_model 32, 2 heads, sinusoidal positions, word ids of the 2,000 most frequent training
words) is trained from scratch under each pooling, followed by a linear layer to two
classes: mean pooling, or attention pooling with a learned query (`nn/attention_pooling.py`,
started at zero, i.e. at mean pooling). Adam, lr 3e-3, batch 32; validation accuracy after
`--steps`, each seed once per pooling (seed s seeds both alike).
"""

from __future__ import annotations

import argparse
import gzip
import random
import statistics
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from attnkit.config import ModelConfig
from attnkit.data.batch import pad
from attnkit.models import build_model
from attnkit.nn.attention_pooling import AttentionPooling
from attnkit.pooling import mean_pool
from attnkit.train.vector_text import split_words
from bench.harness import Result, finish, opening

WORDS = 2000
DOG = {"dog", "dogs"}


def captions(data_dir: Path, split: str) -> list[list[str]]:
    with gzip.open(data_dir / "multi30k" / f"{split}.en.gz", "rt", encoding="utf-8") as f:
        return [split_words(line.lower()) for line in f.read().splitlines()]


def balanced(sentences: list[list[str]], seed: int) -> list[tuple[list[str], int]]:
    dogs = [s for s in sentences if DOG & set(s)]
    others = random.Random(seed).sample([s for s in sentences if not DOG & set(s)], len(dogs))
    return [(s, 1) for s in dogs] + [(s, 0) for s in others]


class Classifier(nn.Module):
    def __init__(self, pooling: str, vocab: int) -> None:
        super().__init__()
        config = ModelConfig(
            shape="encoder", vocab_size=vocab, d_model=32, n_heads=2, d_ff=64,
            n_encoder_layers=1, dropout=0.0, embedding_dropout=0.0, max_len=128,
            norm_position="pre", tie_embeddings="none",
        )  # fmt: skip
        self.encoder = build_model(config)
        self.attention = AttentionPooling(32) if pooling == "attention" else None
        self.out = nn.Linear(32, 2)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(ids, mask, need_logits=False).hidden
        pooled = mean_pool(hidden, mask) if self.attention is None else self.attention(hidden, mask)
        return self.out(pooled)


def run(pooling: str, seed: int, train, valid, index, steps: int) -> float:
    torch.manual_seed(seed)
    model = Classifier(pooling, len(index) + 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = random.Random(seed)

    def batch(rows):
        ids = [[index.get(w, 1) for w in words][:128] or [1] for words, _ in rows]
        tensor, mask = pad(ids, 0)
        return tensor, mask, torch.tensor([label for _, label in rows])

    for _ in range(steps):
        ids, mask, labels = batch(rng.sample(train, 32))
        loss = nn.functional.cross_entropy(model(ids, mask), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        ids, mask, labels = batch(valid)
        return float((model(ids, mask).argmax(-1) == labels).float().mean()) * 100


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench attention-pooling", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    train_sentences = captions(args.data_dir, "train")
    counts = Counter(w for s in train_sentences for w in s)
    index = {w: i + 2 for i, (w, _) in enumerate(counts.most_common(WORDS))}  # 0 pad, 1 unknown
    train = balanced(train_sentences, 0)
    valid = balanced(captions(args.data_dir, "val"), 0)
    header = opening(
        f"{len(train):,} training and {len(valid):,} validation captions, {args.steps} steps, "
        f"{args.seeds} seeds, {args.threads} threads"
    )
    accuracy = {
        p: [run(p, s, train, valid, index, args.steps) for s in range(args.seeds)]
        for p in ("mean", "attention")
    }
    extra = {p: " ".join(f"{v:.1f}" for v in accuracy[p]) for p in accuracy}
    diff = statistics.mean(accuracy["attention"]) - statistics.mean(accuracy["mean"])
    result = Result(
        "dog or not: attention pooling vs mean pooling", "validation accuracy %",
        accuracy["attention"], accuracy["mean"], "mean pooling",
        extra={**extra, "mean difference": f"{diff:+.1f}"},
    )  # fmt: skip
    finish([result], header, args.out)


if __name__ == "__main__":
    main()
