"""Tiny models and synthetic batches shared by the training tests."""

from __future__ import annotations

import torch

from attnkit.config import ModelConfig
from attnkit.data.batch import Batch, pad
from attnkit.models import build_model

VOCAB = 24


def tiny_config(shape: str = "encoder-decoder", **changes) -> ModelConfig:
    layers = {
        "encoder-decoder": {"n_encoder_layers": 1, "n_decoder_layers": 1},
        "decoder": {"n_decoder_layers": 2, "tie_embeddings": "decoder"},
        "encoder": {"n_encoder_layers": 2, "tie_embeddings": "decoder"},
    }[shape]
    base = {"shape": shape, "vocab_size": VOCAB, "d_model": 16, "n_heads": 2, "d_ff": 32}
    return ModelConfig.from_dict({**base, "max_len": 32, **layers, **changes})


def tiny_model(shape: str = "encoder-decoder", seed: int = 0, **changes):
    torch.manual_seed(seed)
    return build_model(tiny_config(shape, **changes))


def translation_batches(n: int, batch_size: int = 4, seed: int = 0) -> list[Batch]:
    """Random source sentences whose target is the source plus one (mod the real ids), padded."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        lengths = torch.randint(2, 7, (batch_size,), generator=g).tolist()
        srcs = [torch.randint(5, VOCAB, (k,), generator=g).tolist() for k in lengths]
        tgts = [[1, *[5 + (t - 4) % (VOCAB - 5) for t in s], 2] for s in srcs]
        src, src_mask = pad(srcs, 0)
        tgt, tgt_mask = pad(tgts, 0)
        batches.append(Batch(src, src_mask, tgt, tgt_mask))
    return batches


def merge(a: Batch, b: Batch) -> Batch:
    """One batch holding the rows of `a` then `b`, padded to the longer of each side."""

    def cat(x, y):
        width = max(x.shape[1], y.shape[1])
        return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in (x, y)])

    return Batch(
        cat(a.src, b.src),
        cat(a.src_mask, b.src_mask),
        cat(a.tgt, b.tgt),
        cat(a.tgt_mask, b.tgt_mask),
    )
