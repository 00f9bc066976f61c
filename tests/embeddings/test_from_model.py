"""Word vectors from a model's token embeddings: the rows themselves, the words their tokens
stand for, and a language model trained on a sliding window whose vectors group words that
predict alike, exported and scored from the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from attnkit.embeddings.from_model import model_vectors
from attnkit.embeddings.vectors import load_vectors
from attnkit.errors import AttnkitError
from attnkit.models import build_model
from attnkit.tokenizer import Tokenizer
from attnkit.train.run_config import RunConfig
from attnkit.train.tasks import train
from tests.helpers import tiny_config

TEXT = ["the cat sat on the mat", "a dog ran to the park", "un café au lait et une crème brûlée"]


def _model(shape: str, tokenizer: Tokenizer, **changes):
    torch.manual_seed(0)
    return build_model(tiny_config(shape, vocab_size=tokenizer.vocab_size, **changes))


def test_a_word_vocabulary_gives_each_word_its_own_row() -> None:
    tokenizer = Tokenizer.train("word", texts=TEXT)
    model = _model("decoder", tokenizer)
    vectors = model_vectors(model, tokenizer)
    specials = {"<pad>", "<s>", "</s>", "<unk>", "<mask>"}
    assert set(vectors.words) == set(tokenizer.backend.get_vocab()) - specials
    for word in ("cat", "café", "brûlée"):
        row = model.embed.token.weight[tokenizer.token_to_id(word)]
        assert torch.equal(vectors[word], row.detach())


@pytest.mark.parametrize("kind", ["bpe", "byte-bpe", "wordpiece"])
def test_subword_vocabularies_give_only_the_pieces_that_start_words(kind) -> None:
    tokenizer = Tokenizer.train(kind, texts=TEXT * 20, vocab_size=400)
    model = _model("decoder", tokenizer, max_len=64)
    vectors = model_vectors(model, tokenizer)
    for word in vectors.words:
        ids = tokenizer.encode(f"x {word}")[1:]  # after a word, so it starts one
        assert tokenizer.decode(ids).strip() == word
    # a word the vocabulary learned whole, non-ASCII too, is there under its own spelling
    assert "café" in vectors and "the" in vectors
    id_ = tokenizer.encode("x café")[-1]
    assert torch.equal(vectors["café"], model.embed.token.weight[id_].detach())
    assert not any(w.startswith(("##", "▁", "Ġ")) for w in vectors.words)


def test_an_encoder_decoder_gives_either_side() -> None:
    tokenizer = Tokenizer.train("word", texts=TEXT)
    model = _model("encoder-decoder", tokenizer, tie_embeddings="none")
    target, source = (model_vectors(model, tokenizer, side) for side in ("target", "source"))
    row = tokenizer.token_to_id("cat")
    assert torch.equal(target["cat"], model.tgt_embed.token.weight[row].detach())
    assert torch.equal(source["cat"], model.src_embed.token.weight[row].detach())
    with pytest.raises(AttnkitError, match="only an encoder-decoder has a source embedding"):
        model_vectors(_model("decoder", tokenizer), tokenizer, "source")
    small = Tokenizer.train("word", texts=TEXT[:1])
    with pytest.raises(AttnkitError, match="give the tokenizer the model was trained with"):
        model_vectors(_model("decoder", small), tokenizer)


def test_a_language_models_embeddings_group_the_words_that_predict_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # animals and vehicles each in their own contexts: only the next-word task tells them apart
    g = torch.Generator().manual_seed(0)
    animals, vehicles = ["cat", "dog", "horse"], ["car", "truck", "bus"]
    lines = []
    for _ in range(600):
        a, v = (group[int(torch.randint(3, (1,), generator=g))] for group in (animals, vehicles))
        lines += [f"the {a} eats grass and sleeps", f"the {v} needs fuel and drives"]
    corpus = tmp_path / "text.txt"
    corpus.write_text("\n".join(lines) + "\n")
    config = RunConfig.from_dict(
        {
            "data": {"task": "language-model", "corpus": str(corpus), "tokenizer": "word",
                     "block_size": 8, "batch_size": 16},
            "model": {"preset": "gpt-tiny", "d_model": 16, "n_heads": 2, "d_ff": 32,
                      "n_decoder_layers": 1, "max_len": 16},
            "train": {"out_dir": str(tmp_path / "run"), "steps": 80, "lr": 3e-3,
                      "schedule": "constant", "warmup": 0, "seed": 0, "threads": 1,
                      "device": "cpu", "save_every": 80, "label_smoothing": 0.0},
            "eval": {"every": 80, "max_batches": 1},
        }
    )  # fmt: skip
    train(config)
    out = tmp_path / "lm_vectors.txt"
    assert main(["embed", "export", str(tmp_path / "run"), str(out)]) == 0
    assert "vectors of dimension 16" in capsys.readouterr().out
    vectors = load_vectors(out)
    within = [vectors.similarity(a, b) for group in (animals, vehicles)
              for a in group for b in group if a < b]  # fmt: skip
    across = [vectors.similarity(a, v) for a in animals for v in vehicles]
    assert min(within) > max(across)
    # the run folder itself is read as vectors by every embed command
    assert main(["embed", "nearest", str(tmp_path / "run"), "cat", "-k", "2"]) == 0
    nearest = [line.split()[1] for line in capsys.readouterr().out.splitlines()]
    assert set(nearest) == {"dog", "horse"}
