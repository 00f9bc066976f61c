"""Pretrained word vectors as a Transformer's first token embeddings (`train.init_embeddings`).

A token takes the vector of the word it stands for: itself for a word-level
vocabulary; for subword vocabularies only a piece that starts a word (`▁dog`
of bpe and unigram, `Ġdog` of byte-bpe) stands for the word `dog`, and pieces
inside words (`##ing`, an unmarked bpe piece) and special tokens keep their
random start. A word is looked up as it is, then case-blind. The vectors
found are scaled together so that their standard deviation is the one the
embedding was initialised with (d^-1/2 under the paper's sqrt(d) scaling):
directions come from the vectors, the scale the model expects is kept. Every
token embedding of the model (the encoder's, the decoder's, tied or not) is
set, each row once however many layers share it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnkit.embeddings.vectors import WordVectors
from attnkit.errors import AttnkitError
from attnkit.nn.embedding import TokenEmbedding

WORD_STARTS = ("▁", "Ġ")  # sentencepiece's and GPT-2's marks of a piece that begins a word


@dataclass(frozen=True)
class Coverage:
    """How many of the vocabulary's tokens got a vector, and a few that did not."""

    found: int
    missing: int
    examples: tuple[str, ...]

    def describe(self) -> str:
        total = max(self.found + self.missing, 1)
        shown = ", ".join(self.examples)
        return (
            f"{self.found} of {total} tokens found in the vectors ({self.found / total:.0%}), "
            f"{self.missing} not" + (f" (such as {shown})" if shown else "")
        )


def token_words(tokens: list[str | None], specials: set[int]) -> dict[int, str]:
    """The word each token id stands for, where it stands for one (see the module's doc)."""
    marked = any(t is not None and t.startswith(WORD_STARTS) for t in tokens)
    words = {}
    for i, token in enumerate(tokens):
        if token is None or i in specials or token.startswith("##"):
            continue
        if marked:
            if not token.startswith(WORD_STARTS) or len(token) == 1:
                continue
            token = token[1:]
        words[i] = token
    return words


def init_embeddings(model: nn.Module, tokenizer, vectors: WordVectors) -> Coverage:
    """Set the rows of `model`'s token embeddings from `vectors`; return the coverage."""
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    specials = special_ids(tokenizer)
    lowered: dict[str, int] = {}
    for row, word in enumerate(vectors.words):
        lowered.setdefault(word.lower(), row)  # the most frequent spelling stands for the word
    found: dict[int, int] = {}
    for i, word in token_words(tokens, specials).items():
        row = vectors.index.get(word)
        row = lowered.get(word.lower()) if row is None else row
        if row is not None:
            found[i] = row
    tables = {id(m.weight): m.weight for m in model.modules() if isinstance(m, TokenEmbedding)}
    for weight in tables.values():
        if weight.shape[1] != vectors.dim:
            raise AttnkitError(
                f"the vectors have dimension {vectors.dim} but the model's embeddings "
                f"{weight.shape[1]}; train vectors with word2vec.dim = {weight.shape[1]}"
            )
        if found:
            ids, rows = torch.tensor(list(found)), torch.tensor(list(found.values()))
            chosen = vectors.vectors[rows]
            with torch.no_grad():
                weight[ids] = (chosen * (weight.std() / chosen.std())).to(weight.dtype)
    missing = [tokens[i] for i in range(len(tokens)) if i not in found and i not in specials]
    return Coverage(len(found), len(missing), tuple(str(t) for t in missing[:5]))


def special_ids(tokenizer) -> set[int]:
    """The ids of the tokenizer's special tokens (padding, begin, end, unknown, mask)."""
    roles = ("pad", "bos", "eos", "unk", "mask")
    names = {
        tokenizer.id_to_token(getattr(tokenizer, f"{role}_id"))
        for role in roles
        if tokenizer.has(role)
    }
    return {i for i in range(tokenizer.vocab_size) if tokenizer.id_to_token(i) in names}
