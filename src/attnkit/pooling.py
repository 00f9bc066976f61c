"""Sentence embeddings: the mean of a sentence's token vectors, L2-normalised.

    e = u / ||u||_2,   u = sum_t m_t h_t / sum_t m_t

where h_t are the encoder's last hidden states and m_t is 1 for real tokens
and 0 for padding, so padding never moves an embedding. This is what
sentence-transformers computes for all-MiniLM-L6-v2 (mean pooling, then
normalisation), and the cosine of two embeddings is their dot product.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.errors import AttnkitError
from attnkit.models import EncoderOnly


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """(batch, length, d_model) hidden states and a (batch, length) mask -> (batch, d_model)."""
    if mask.shape != hidden.shape[:2]:
        raise AttnkitError(
            f"the mask has shape {tuple(mask.shape)} but the hidden states have "
            f"{tuple(hidden.shape[:2])} tokens; give one mask value per token"
        )
    weights = mask.to(hidden.dtype)[..., None]
    # The clamp keeps an all-padding row at zero instead of 0/0.
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


@torch.no_grad()
def sentence_embeddings(
    model: EncoderOnly, ids: Tensor, mask: Tensor, *, normalize: bool = True
) -> Tensor:
    """Unit-length sentence vectors (batch, d_model) from an encoder model's hidden states."""
    pooled = mean_pool(model(ids, mask).hidden, mask)
    return F.normalize(pooled, p=2, dim=-1) if normalize else pooled
