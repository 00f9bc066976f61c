"""Pretrained vectors into a Transformer's token embeddings: which token stands for which word,
each found vector in its token's row at the embedding's scale, and the coverage reported."""

from __future__ import annotations

import pytest
import torch

from attnkit.config import ModelConfig
from attnkit.embeddings.pretrained import init_embeddings, token_words
from attnkit.embeddings.vectors import WordVectors
from attnkit.errors import AttnkitError
from attnkit.models import build_model
from attnkit.tokenizer import Tokenizer

TEXT = ["a dog runs in the park", "the dog and the cat", "a cat sleeps"] * 20


def test_which_tokens_stand_for_words() -> None:
    assert token_words(["<pad>", "dog", "cat"], {0}) == {1: "dog", 2: "cat"}
    marked = ["<pad>", "▁dog", "s", "▁", "▁Cat"]
    assert token_words(marked, {0}) == {1: "dog", 4: "Cat"}  # pieces inside words keep theirs
    assert token_words(["[PAD]", "dog", "##s"], {0}) == {1: "dog"}
    assert token_words(["Ġdog", "dog"], set()) == {0: "dog"}  # byte-bpe: unmarked is inside


def _model(tokenizer: Tokenizer, tie: str = "all", d_model: int = 8):
    config = ModelConfig(
        shape="encoder-decoder", vocab_size=tokenizer.vocab_size, d_model=d_model, n_heads=2,
        n_encoder_layers=1, n_decoder_layers=1, d_ff=16, tie_embeddings=tie,
    )  # fmt: skip
    return build_model(config)


@pytest.mark.parametrize(("kind", "tie"), [("word", "all"), ("bpe", "none")])
def test_each_found_vector_lands_in_its_tokens_row(kind: str, tie: str) -> None:
    tokenizer = Tokenizer.train(kind, texts=TEXT, vocab_size=60)
    model = _model(tokenizer, tie)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "embed" in n}
    torch.manual_seed(1)
    vectors = WordVectors(["dog", "Cat", "park", "zebra"], torch.randn(4, 8) * 3)
    coverage = init_embeddings(model, tokenizer, vectors)
    tables = [p for n, p in model.named_parameters() if n in before and p.dim() == 2]
    assert tables
    for name, weight in model.named_parameters():
        if name not in before or weight.dim() != 2:
            continue
        rows = {}
        for word, row in (("dog", 0), ("cat", 1), ("park", 2)):
            token = word if kind == "word" else f"▁{word}"
            i = tokenizer.token_to_id(token)
            if i is not None:
                rows[i] = row
        assert len(rows) == coverage.found == 3  # "cat" by its lower case; no zebra in the text
        ids = torch.tensor(list(rows))
        got = weight.detach()[ids]
        wanted = vectors.vectors[list(rows.values())]
        # the vectors' directions, at the scale the embedding started with
        assert torch.allclose(
            got / got.norm(dim=1, keepdim=True),
            wanted / wanted.norm(dim=1, keepdim=True),
            atol=1e-5,
        )
        assert got.std() == pytest.approx(float(before[name].std()), rel=1e-4)
        others = torch.ones(len(weight), dtype=torch.bool)
        others[ids] = False
        assert torch.equal(weight.detach()[others], before[name][others])
    assert coverage.found + coverage.missing == tokenizer.vocab_size - 5  # the five specials
    assert coverage.describe().startswith(f"3 of {tokenizer.vocab_size - 5} tokens found")


def test_vectors_of_another_width_are_refused() -> None:
    tokenizer = Tokenizer.train("word", texts=TEXT, vocab_size=40)
    vectors = WordVectors(["dog"], torch.randn(1, 5))
    with pytest.raises(AttnkitError, match="dimension 5 but the model's embeddings 8"):
        init_embeddings(_model(tokenizer), tokenizer, vectors)
