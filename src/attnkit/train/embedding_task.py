"""The `sentence-embedding` task of `attnkit train`: an encoder's sentence vectors trained so a
sentence and its translation meet, against the other sentences of the batch (in-batch
negatives, InfoNCE; the contrastive loss of sentence-transformers' MultipleNegativesRanking).

For a batch of n translation pairs (x_i, y_i), each pooled to a unit vector by `[embedding]
pooling` (`attnkit.pooling`: mean, or attention with a learned query), with s_ij = u_i . v_j / tau,

    L = 1/2n sum_i [ -log softmax_j(s_ij)_i  -  log softmax_j(s_ji)_i ]

both ways: each source picks its translation among the batch's targets, and each target its
source. The validation measures the same on the whole validation split at once: `val_loss`
(the loss above with every validation pair as a negative) and `retrieval_accuracy`, the share
of sources whose nearest target (by cosine) is their own translation. Chance is 1/N.

    [data]       task = "sentence-embedding", corpus (of two languages), src_lang, tgt_lang,
                 batch_size (pairs a step), max_len
    [embedding]  pooling, temperature
    [model]      an encoder (`shape = "encoder"`); its vocabulary projection is not used

Both sides are read as the model reads a sentence for `attnkit embed`: `<s> text </s>`, through
one joint tokenizer. The run folder's `pooling.json` says the pooling, and a learned one's query
is the model's submodule (`attnkit.pooling.attach_pooling`), in model.safetensors: so `attnkit
embed`, `/v1/embeddings` and `Run.sentence_encoder()` pool as the run was trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from attnkit.checks import check, choice, finite_fields, with_article
from attnkit.data.batch import Batch, pad
from attnkit.data.sources import corpus_text
from attnkit.models import TransformerModel
from attnkit.pooling import LEARNED_MODES, MODES, Pooling, learned_pooling, pool
from attnkit.run import load_run
from attnkit.tokenizer import Tokenizer
from attnkit.train.cross_entropy import LossTerms
from attnkit.train.metrics import Metric
from attnkit.train.objectives import TrainingObjective

POOLINGS = (*MODES, *LEARNED_MODES)


@dataclass(frozen=True)
class EmbeddingSection:
    """Sentence vectors trained on translation pairs (`data.task = "sentence-embedding"`).

    pooling: how the token states become one vector (`attnkit.pooling`): `mean`, `cls`, `max`,
        ..., or `attention` (a learned query, `attnkit.nn.attention_pooling`); the vectors are
        then normalised to unit length, as the run folder's pooling.json records.
    temperature: tau, dividing the cosine similarities before the softmax (sentence-transformers
        uses 0.05: a scale of 20).
    """

    pooling: str = "mean"
    temperature: float = 0.05

    def __post_init__(self) -> None:
        finite_fields(self, "embedding")
        choice("embedding.pooling", self.pooling, POOLINGS)
        check(
            self.temperature > 0,
            f"embedding.temperature must be positive, got {self.temperature!r}",
        )

    def to_pooling(self) -> Pooling:
        return Pooling(modes=(self.pooling,), normalize=True)


def pair_batch(examples: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int) -> Batch:
    """n (source, target) id pairs to one `src` of 2n rows, sources first: one forward reads
    both sides (what DDP synchronises)."""
    rows = [list(s) for s, _ in examples] + [list(t) for _, t in examples]
    ids, mask = pad(rows, pad_id)
    return Batch(src=ids, src_mask=mask)


def sentence_vectors(model: nn.Module, batch: Batch, pooling: Pooling) -> Tensor:
    """Each row's unit vector (rows, d_model) with gradient, pooled by `pooling` (a learned
    mode by the model's own module)."""
    hidden = model(batch.src, batch.src_mask, need_logits=False).hidden
    return pool(hidden, batch.src_mask, pooling, learned_pooling(model)).float()


def contrastive_losses(sources: Tensor, targets: Tensor, temperature: float) -> Tensor:
    """Each pair's loss (n,): the mean of its two directions' cross-entropy over the batch."""
    scores = sources @ targets.T / temperature
    truth = torch.arange(len(scores), device=scores.device)
    way = partial(F.cross_entropy, target=truth, reduction="none")
    return (way(scores) + way(scores.T)) / 2


class InBatchContrastive(TrainingObjective):
    """The Trainer's objective: the summed loss of a `pair_batch`'s pairs and their count."""

    task = "sentence-embedding"

    def __init__(self, pooling: Pooling, temperature: float) -> None:
        super().__init__()
        self.pooling, self.temperature = pooling, temperature

    def __call__(self, model: nn.Module, batch: Batch) -> LossTerms:
        vectors = sentence_vectors(model, batch, self.pooling)
        n = len(vectors) // 2
        losses = contrastive_losses(vectors[:n], vectors[n:], self.temperature)
        return LossTerms(losses.sum(), losses.detach().sum(), losses.new_tensor(float(n)))


def retrieval_metric(
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    pad_id: int,
    pooling: Pooling,
    temperature: float,
    batch_size: int = 64,
) -> Metric:
    """The validation over every pair at once: `val_loss` (every other pair a negative) and
    `retrieval_accuracy` (the share of sources whose nearest target is their own)."""

    @torch.no_grad()
    def vectors(model: TransformerModel, rows: Sequence[Sequence[int]]) -> Tensor:
        out = []
        for start in range(0, len(rows), batch_size):
            ids, mask = pad([list(r) for r in rows[start : start + batch_size]], pad_id)
            batch = Batch(src=ids.to(model.device), src_mask=mask.to(model.device))
            out.append(sentence_vectors(model, batch, pooling).double())
        return torch.cat(out)

    def metric(model: TransformerModel) -> dict[str, float]:
        u, v = vectors(model, sources), vectors(model, targets)
        truth = torch.arange(len(u), device=u.device)
        return {
            "val_loss": contrastive_losses(u, v, temperature).mean().item(),
            "retrieval_accuracy": ((u @ v.T).argmax(-1) == truth).double().mean().item(),
        }

    return metric


class PairDataset(Dataset):
    """Translation pairs, both sides as `<s> text </s>` ids of at most `max_len`; pairs with an
    empty side or a side over `max_len` are left out. What `run_loader` batches by length."""

    def __init__(
        self, sources: Sequence[str], targets: Sequence[str], tokenizer: Tokenizer, max_len: int
    ) -> None:
        check(len(sources) == len(targets), "a translation pair has one target per source")
        encode = partial(tokenizer.encode_batch, add_bos=True, add_eos=True)
        sides = encode(list(sources)), encode(list(targets))
        kept = [
            (s, t)
            for s, t, a, b in zip(*sides, sources, targets, strict=True)
            if a.strip() and b.strip() and max(len(s), len(t)) <= max_len
        ]
        check(bool(kept), f"no translation pair has both sides within {max_len} ids")
        self.pairs = kept
        self.lengths = np.array([[len(s), len(t)] for s, t in kept], dtype=np.int64)
        self.collate = partial(pair_batch, pad_id=tokenizer.pad_id)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[list[int], list[int]]:
        return self.pairs[index]


def evaluate_run(run_dir: str | Path, split: str = "test") -> dict[str, float]:
    """`retrieval_metric` of a trained sentence-embedding run on `split` of the corpus it was
    trained on (its run config's [data] and [embedding]), pooled as the run pools."""
    run = load_run(run_dir)
    d = run.data
    check(
        d.task == "sentence-embedding",
        f"{run.folder.root} is {with_article(d.task)} run; give a sentence-embedding run's folder",
    )
    recorded = tomllib.loads(run.folder.run_config.read_text(encoding="utf-8"))
    section = EmbeddingSection(**recorded.get("embedding", {}))
    max_len = min(d.max_len, run.model.config.max_len)
    pairs = PairDataset(*corpus_text(d, split, (d.src_lang, d.tgt_lang)), run.tokenizer, max_len)
    sources, targets = zip(*pairs.pairs, strict=True)
    pooling = run.folder.read_pooling()
    metric = retrieval_metric(sources, targets, run.tokenizer.pad_id, pooling,
                              section.temperature)  # fmt: skip
    return {**metric(run.model), "pairs": len(pairs)}
