"""Word vectors from a trained model's token embeddings: the first way the notes learn them.

A language model that predicts the next word from a sliding window of the
words before it, p(w_t | w_{t-n} .. w_{t-1}) = softmax(f(E[w_{t-n}], .., E[w_{t-1}])),
learns its embedding matrix E on the way (Bengio et al. 2003): words that
predict alike get rows that point alike. `model_vectors` turns a trained
model's E into `WordVectors`, which then save, load and score as any word2vec
or GloVe file does (`attnkit embed export RUN OUT`, `attnkit embed eval RUN`).

A row becomes the vector of the word its token stands for (`token_words`: a
word-level token itself; of subword vocabularies only a piece that starts a
word, so `▁dog` gives `dog` and `##ing` nothing), spelt as the tokenizer
decodes it (which turns byte-level BPE's bytes back into text). Special tokens,
pieces inside words and tokens whose text is empty, holds a space or is part of
a character (a byte-level piece that ends inside a UTF-8 sequence) are left out.
A piece that starts a word may be less than a word (`▁lai` of `lait`): such
vectors stand for strings no benchmark asks about. The rows are E itself: the
sqrt(d_model) a model may scale them by changes no cosine.
"""

from __future__ import annotations

import torch
from torch import nn

from attnkit.embeddings.pretrained import special_ids, token_words
from attnkit.embeddings.vectors import WordVectors
from attnkit.errors import AttnkitError
from attnkit.nn.embedding import TokenEmbedding
from attnkit.tokenizer import Tokenizer

SIDES = ("target", "source")


def model_vectors(model: nn.Module, tokenizer: Tokenizer, side: str = "target") -> WordVectors:
    """The words of `tokenizer` with their rows of `model`'s input embedding.

    side: an encoder-decoder's `target` (the decoder's, the next-word predictor's) or
        `source` (the encoder's) embedding; a one-stack model has one.
    """
    if side not in SIDES:
        raise AttnkitError(f"unknown side {side!r}; choose target or source.")
    owner = getattr(model, "src_embed" if side == "source" else "tgt_embed", None)
    if owner is None and side == "source":
        raise AttnkitError("only an encoder-decoder has a source embedding; leave side target.")
    owner = owner or getattr(model, "embed", None)
    token = getattr(owner, "token", None)
    if not isinstance(token, TokenEmbedding):
        raise AttnkitError("this model has no token embedding to take word vectors from.")
    weight = token.weight.detach().float().cpu()
    if weight.shape[0] < tokenizer.vocab_size:
        raise AttnkitError(
            f"the model embeds {weight.shape[0]} tokens but the tokenizer has "
            f"{tokenizer.vocab_size}; give the tokenizer the model was trained with."
        )
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    ids, words = [], []
    for i in token_words(tokens, special_ids(tokenizer)):
        word = tokenizer.decode([i], skip_special=False).strip()
        if word and not any(ch.isspace() or ch == "\ufffd" for ch in word):
            ids.append(i)
            words.append(word)
    if not words:
        raise AttnkitError("no token of this tokenizer stands for a whole word.")
    return WordVectors(words, weight[torch.tensor(ids)])
