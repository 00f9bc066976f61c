"""The `sentence-embedding` task: sentence vectors trained so a sentence meets its translation
among the batch's others, with mean or attention pooling, the latter's query kept in the run."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from attnkit.cli import main
from attnkit.data.batch import Batch, pad
from attnkit.errors import AttnkitError
from attnkit.pooling import Pooling, learned_pooling
from attnkit.run import RunFolder, load_run
from attnkit.train.embedding_task import (
    contrastive_losses,
    evaluate_run,
    pair_batch,
    sentence_vectors,
)
from attnkit.train.run_config import RunConfig
from attnkit.train.tasks import train
from tests.helpers import tiny_run

LEXICON = {"hund": "dog", "katze": "cat", "mann": "man", "frau": "woman", "kind": "child",
           "rot": "red", "blau": "blue", "groß": "big", "klein": "small", "rennt": "runs",
           "schläft": "sleeps", "springt": "jumps", "ball": "ball", "haus": "house"}  # fmt: skip


def write_pairs(folder: Path, split: str, n: int, seed: int) -> None:
    """`n` German sentences of 3 to 6 words and their word-for-word English."""
    rng, words = random.Random(seed), sorted(LEXICON)
    de = [" ".join(rng.choices(words, k=rng.randint(3, 6))) for _ in range(n)]
    folder.mkdir(exist_ok=True)
    (folder / f"{split}.de").write_text("\n".join(de) + "\n")
    en = [" ".join(LEXICON[w] for w in line.split()) for line in de]
    (folder / f"{split}.en").write_text("\n".join(en) + "\n")


def embedding_config(tmp_path: Path, pooling: str, steps: int = 60) -> Path:
    corpus = tmp_path / "corpus"
    write_pairs(corpus, "train", 400, 0)
    write_pairs(corpus, "val", 40, 1)
    path = tmp_path / f"{pooling}.toml"
    path.write_text(f"""
[model]
shape = "encoder"
d_model = 32
n_heads = 2
d_ff = 64
n_encoder_layers = 1
dropout = 0.0
embedding_dropout = 0.0
tie_embeddings = "decoder"
max_len = 16

[data]
task = "sentence-embedding"
corpus = "{corpus}"
src_lang = "de"
tgt_lang = "en"
tokenizer = "word"
batch_size = 16

[embedding]
pooling = "{pooling}"

[train]
out_dir = "{tmp_path / pooling}"
steps = {steps}
lr = 3e-3
schedule = "constant"
warmup = 0
threads = 1
log_every = 20
save_every = {steps}

[eval]
every = {steps}
metric = "retrieval_accuracy"
""")
    return path


def test_the_loss_is_infonce_both_ways_by_hand() -> None:
    rng = np.random.default_rng(0)
    u, v = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    s = u @ v.T / 0.5

    def nll(scores: np.ndarray) -> np.ndarray:
        return -(np.diag(scores) - np.log(np.exp(scores).sum(1)))

    expected = (nll(s) + nll(s.T)) / 2
    got = contrastive_losses(torch.tensor(u), torch.tensor(v), 0.5)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)


def test_a_batch_reads_sources_then_targets_in_one_padded_forward() -> None:
    batch = pair_batch([([1, 5, 2], [1, 6, 7, 2]), ([1, 8, 2], [1, 9, 2])], pad_id=0)
    assert batch.src.tolist() == [[1, 5, 2, 0], [1, 8, 2, 0], [1, 6, 7, 2], [1, 9, 2, 0]]
    assert batch.src_mask.sum(1).tolist() == [3, 3, 4, 3]


@pytest.mark.parametrize("pooling", ["mean", "attention"])
def test_a_trained_run_retrieves_translations_and_reloads_to_the_same_vectors(
    tmp_path: Path, pooling: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", str(embedding_config(tmp_path, pooling))]) == 0
    folder = RunFolder(tmp_path / pooling)
    assert folder.read_pooling() == Pooling(modes=(pooling,))
    recorded = [r for r in folder.read_metrics() if "retrieval_accuracy" in r][-1]
    assert recorded["retrieval_accuracy"] > 0.5  # chance is 1 in 40
    run = load_run(folder.root)
    module = learned_pooling(run.model)
    if pooling == "attention":  # trained away from zero (the mean), and loaded
        assert module is not None and module.query.abs().max() > 1e-3
    else:
        assert module is None
    # The loaded run measures what the trained one did: its query is the trained one.
    again = evaluate_run(folder.root, "val")
    assert again["val_loss"] == pytest.approx(recorded["val_loss"], abs=1e-6)
    assert again["retrieval_accuracy"] == recorded["retrieval_accuracy"]
    assert again["pairs"] == 40
    val = [(folder.root.parent / "corpus" / f"val.{lang}").read_text().splitlines()
           for lang in ("de", "en")]  # fmt: skip
    ids = [run.sentence_encoder().ids(side) for side in val]
    # and `Run.sentence_encoder` (what /v1/embeddings calls) pools by the same module
    vectors = run.sentence_encoder().encode(val[0][:3])
    src, mask = pad(ids[0][:3], run.tokenizer.pad_id)
    with torch.no_grad():
        trained = sentence_vectors(run.model, Batch(src=src, src_mask=mask), folder.read_pooling())
    torch.testing.assert_close(vectors, trained, atol=1e-6, rtol=0)
    # the command line: the split's retrieval, and the cosines of a few sentences' vectors
    capsys.readouterr()
    assert main(["embed", "retrieval", str(folder.root), "--split", "val"]) == 0
    accuracy = f"retrieval accuracy {recorded['retrieval_accuracy']:.4f} (40 pairs"
    assert accuracy in capsys.readouterr().out
    assert main(["embed", "sentences", str(folder.root), val[0][0], val[1][0], val[1][1]]) == 0
    rows = [line.split()[:3] for line in capsys.readouterr().out.splitlines()]
    cosines = torch.tensor([[float(c) for c in row] for row in rows])
    unit = run.sentence_encoder().encode([val[0][0], val[1][0], val[1][1]])
    torch.testing.assert_close(cosines, (unit @ unit.T).round(decimals=4), atol=1e-4, rtol=0)
    assert cosines[0, 1] > cosines[0, 2]  # a caption is nearer its translation than another's


def test_the_attention_run_resumes_with_its_query(tmp_path: Path) -> None:
    config = embedding_config(tmp_path, "attention", steps=10)
    assert main(["train", str(config)]) == 0
    first = load_run(tmp_path / "attention").model.sentence_pooling.query.detach().clone()
    assert main(["train", str(config), "--resume", "--set", "train.steps=20",
                 "--set", "train.save_every=10"]) == 0  # fmt: skip
    state = torch.load(RunFolder(tmp_path / "attention").trainer_state, weights_only=False)
    assert state["step"] == 20
    second = load_run(tmp_path / "attention").model.sentence_pooling.query
    assert not torch.equal(first, second)  # trained on from the saved query


def test_bad_settings_are_one_sentence(tmp_path: Path) -> None:
    config = embedding_config(tmp_path, "mean")
    with pytest.raises(AttnkitError, match=r"embedding.pooling 'sum' is not one of"):
        RunConfig.load(config, ["embedding.pooling=sum"])
    with pytest.raises(AttnkitError, match=r"embedding.temperature must be positive"):
        RunConfig.load(config, ["embedding.temperature=0"])
    bad = RunConfig.load(
        config, ["model.shape=decoder", "model.n_decoder_layers=1", "model.n_encoder_layers=0"]
    )
    with pytest.raises(AttnkitError, match="trains an encoder model"):
        train(bad)
    other = tiny_run(tmp_path / "other", "encoder")
    with pytest.raises(AttnkitError, match="give a sentence-embedding run's folder"):
        evaluate_run(other, "val")
