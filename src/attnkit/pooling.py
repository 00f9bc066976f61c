"""Sentence embeddings: an encoder's token vectors pooled into one vector per sentence.

    mean:  u = sum_t m_t h_t / sum_t m_t              (all-MiniLM-L6-v2, most models)
    cls:   u = h_0                                    (the first token, [CLS] or <s>)
    max:   u_i = max_t h_t,i over real tokens
    mean_sqrt_len_tokens:  u = sum_t m_t h_t / sqrt(sum_t m_t)
    weightedmean:  u = sum_t t m_t h_t / sum_t t m_t  (later tokens weigh more)
    lasttoken:  u = h_T, the last real token
    attention:  u = softmax(q H^T / sqrt(d)) H, q learned (`nn/attention_pooling.py`)
    then, if the model asks for it,  e = u / ||u||_2

where h_t are the encoder's last hidden states and m_t is 1 for real tokens and
0 for padding, so padding never moves an embedding. Several modes concatenate
their vectors, in sentence-transformers' order. A sentence is encoded as the
model was trained to read one: `<s> text </s>` ([CLS] text [SEP] for BERT), cut
at `max_tokens` when asked. `Pooling` says how, as the model's own
sentence-transformers files said (`attnkit.interop` reads them on import; a run
folder keeps them as `pooling.json`); the default is mean pooling, normalised.
With it, `SentenceEncoder.encode` gives sentence-transformers' `encode`.

A learned mode's parameters (attention's query) are part of the model: `attach_pooling` adds
the module as the model's submodule `sentence_pooling`, so training optimises and checkpoints
it with the encoder, model.safetensors holds it (`sentence_pooling.query`), and a run folder
whose `pooling.json` names the mode gets it back on loading (`attnkit.run.load_pretrained`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.checks import check, with_article
from attnkit.data.batch import pad
from attnkit.errors import AttnkitError
from attnkit.models import EncoderOnly
from attnkit.models.base import unwrap
from attnkit.nn.attention_pooling import AttentionPooling
from attnkit.tokenizer import Tokenizer

MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# Modes with trained parameters of their own, which sentence-transformers does not have.
LEARNED_MODES = ("attention",)
# The model's submodule holding a learned mode's parameters, and their prefix in the weights.
POOLING_MODULE = "sentence_pooling"


@dataclass(frozen=True)
class Pooling:
    """How an encoder's token vectors become a sentence's: `modes` (concatenated), then
    `normalize` to unit length; inputs cut at `max_tokens` ids (None: the model's max_len)."""

    modes: tuple[str, ...] = ("mean",)
    normalize: bool = True
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "modes", tuple(self.modes))
        check(bool(self.modes), "a pooling needs at least one mode, such as 'mean'")
        for mode in self.modes:
            known = (*MODES, *LEARNED_MODES)
            check(mode in known, f"pooling mode {mode!r} is not one of {', '.join(known)}")
        check(
            self.max_tokens is None or self.max_tokens >= 2,
            f"max_tokens holds a sentence and its two special tokens, not {self.max_tokens}",
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "pooling.json") -> Pooling:
        try:
            fields = json.loads(text)
            return cls(**fields)
        except (json.JSONDecodeError, TypeError) as err:
            raise AttnkitError(
                f"{where} is not a pooling (modes, normalize, max_tokens): {err}; fix or remove it"
            ) from None


def attach_pooling(model: nn.Module, pooling: Pooling) -> nn.Module:
    """`model` with the module of `pooling`'s learned mode as its submodule `sentence_pooling`
    (a new one: attention's query at zero, where it is mean pooling); unchanged if `pooling`
    has no learned mode or the model has the module already."""
    if "attention" not in pooling.modes or hasattr(model, POOLING_MODULE):
        return model
    check(
        model.config.shape == "encoder",
        f"a sentence pooling reads an encoder's states, not those of "
        f"{with_article(model.config.shape)} model",
    )
    device = next(model.parameters()).device
    model.add_module(POOLING_MODULE, AttentionPooling(model.config.d_model).to(device))
    return model


def learned_pooling(model: nn.Module) -> AttentionPooling | None:
    """The learned pooling module `attach_pooling` gave `model` (wrapped or not), or None."""
    return getattr(unwrap(model), POOLING_MODULE, None)


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """(batch, length, d_model) hidden states and a (batch, length) mask -> (batch, d_model)."""
    _check_mask(hidden, mask)
    weights = mask.to(hidden.dtype)[..., None]
    # The clamp keeps an all-padding row at zero instead of 0/0.
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


def pool(
    hidden: Tensor, mask: Tensor, pooling: Pooling, attention: AttentionPooling | None = None
) -> Tensor:
    """(batch, length, d_model) hidden states -> (batch, d_model * len(modes)) by `pooling`;
    the mode `attention` needs its trained query, `attention`."""
    _check_mask(hidden, mask)
    real = mask.to(hidden.dtype)[..., None]
    count = real.sum(1).clamp(min=1e-9)
    vectors = []
    for mode in pooling.modes:
        if mode == "cls":
            first = mask.int().argmax(1)  # the first real token, whichever side the padding is
            vectors.append(hidden[torch.arange(len(hidden)), first])
        elif mode == "max":
            vectors.append(hidden.masked_fill(real == 0, float("-inf")).max(1).values)
        elif mode == "mean":
            vectors.append((hidden * real).sum(1) / count)
        elif mode == "mean_sqrt_len_tokens":
            vectors.append((hidden * real).sum(1) / count.sqrt())
        elif mode == "weightedmean":
            weights = real * torch.arange(1, hidden.shape[1] + 1, dtype=hidden.dtype)[:, None]
            weights = weights - real * mask.int().argmax(1).to(hidden.dtype)[:, None, None]
            vectors.append((hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9))
        elif mode == "attention":
            if attention is None:
                raise AttnkitError(
                    "attention pooling has a learned query: pass the trained AttentionPooling, "
                    "or load the run that trained it (attach_pooling)"
                )
            vectors.append(attention(hidden, mask))
        else:  # lasttoken
            last = mask.shape[1] - 1 - mask.flip(1).int().argmax(1)
            vectors.append(hidden[torch.arange(len(hidden)), last])
    pooled = torch.cat(vectors, dim=-1)
    return F.normalize(pooled, p=2, dim=-1) if pooling.normalize else pooled


@torch.no_grad()
def sentence_embeddings(
    model: EncoderOnly,
    ids: Tensor,
    mask: Tensor,
    *,
    normalize: bool = True,
    pooling: Pooling | None = None,
) -> Tensor:
    """Sentence vectors (batch, dim) from an encoder's hidden states: `pooling`'s, or mean
    pooling (unit length unless `normalize` is False) when none is given; a learned mode uses
    the model's own module (`attach_pooling`)."""
    pooling = pooling or Pooling(normalize=normalize)
    # the hidden states alone: the vocabulary projection would cost (batch, length, vocab)
    hidden = model(ids, mask, need_logits=False).hidden
    return pool(hidden, mask, pooling, learned_pooling(model))


@dataclass(frozen=True)
class SentenceEncoder:
    """Texts to sentence vectors: an encoder, its tokenizer and its pooling."""

    model: EncoderOnly
    tokenizer: Tokenizer
    pooling: Pooling = Pooling()

    @property
    def limit(self) -> int:
        """The most ids of one input, its two special tokens included."""
        limit = self.model.config.max_len
        return limit if self.pooling.max_tokens is None else min(limit, self.pooling.max_tokens)

    def ids(self, texts: Sequence[str], truncate: bool = True) -> list[list[int]]:
        """Each text as the model reads it, `<s> text </s>`, cut at `limit` if `truncate`."""
        if self.model.config.shape != "encoder":
            raise AttnkitError(
                f"sentence vectors come from an encoder; this model is {self.model.config.shape}"
            )
        length = self.limit if truncate else None
        return self.tokenizer.encode_batch(texts, add_bos=True, add_eos=True, max_length=length)

    def encode_ids(self, ids: Sequence[Sequence[int]], batch_size: int = 32) -> Tensor:
        """Sentence vectors (texts, dim) of inputs given as ids, `batch_size` at a time."""
        model, out = self.model, []
        for start in range(0, len(ids), batch_size):
            batch, mask = pad([list(row) for row in ids[start : start + batch_size]],
                              self.tokenizer.pad_id)  # fmt: skip
            device = model.device
            out.append(sentence_embeddings(model, batch.to(device), mask.to(device),
                                           pooling=self.pooling))  # fmt: skip
        return torch.cat(out) if out else torch.empty(0, model.config.d_model)

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Tensor:
        """Sentence vectors (texts, dim): sentence-transformers' `encode` for the same model."""
        return self.encode_ids(self.ids(texts), batch_size)


def _check_mask(hidden: Tensor, mask: Tensor) -> None:
    if mask.shape != hidden.shape[:2]:
        raise AttnkitError(
            f"the mask has shape {tuple(mask.shape)} but the hidden states have "
            f"{tuple(hidden.shape[:2])} tokens; give one mask value per token"
        )
