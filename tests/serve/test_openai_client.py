"""A real client: OpenAI's own Python package against attnkit serve on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from attnkit.serve import work
from attnkit.serve.app import create_app
from attnkit.serve.runs import served_runs
from attnkit.serve.settings import ServeSettings
from attnkit.serve.work import Decoding
from tests.helpers import tiny_run
from tests.serve.live import serving


class Address(str):
    """The server's /v1 address, which also knows the models it serves."""

    def __new__(cls, url: str, served: list) -> Address:
        address = super().__new__(cls, url)
        address.served = served
        return address


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("runs")
    runs = [str(tiny_run(tmp / "gpt", "decoder")), str(tiny_run(tmp / "bert", "encoder"))]
    served = served_runs(runs)
    with serving(create_app(served, ServeSettings(api_key="k"))) as address:
        yield Address(address + "/v1", served)


def test_openai_completes_streams_and_embeds(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="k")
    assert [m.id for m in client.models.list().data] == ["gpt", "bert"]
    done = client.completions.create(model="gpt", prompt="a dog", max_tokens=5, temperature=0)
    gpt = base_url.served[0]
    (expected,) = work.complete(gpt, Decoding(max_new_tokens=5), [gpt.tokenizer.encode("a dog")])
    assert done.choices[0].text == expected.texts[0]
    assert done.choices[0].finish_reason == expected.finish[0]
    assert done.usage.completion_tokens == expected.completion_tokens
    pieces = client.completions.create(
        model="gpt", prompt="a dog", max_tokens=5, temperature=0, stream=True
    )
    chunks = list(pieces)
    assert "".join(c.choices[0].text for c in chunks) == done.choices[0].text
    assert chunks[-1].choices[0].finish_reason == done.choices[0].finish_reason
    vectors = client.embeddings.create(model="bert", input=["a dog", "the cat"])
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 16
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base_url, api_key="wrong").models.list()
    with pytest.raises(openai.NotFoundError, match="no model 'llama'"):
        client.completions.create(model="llama", prompt="x", max_tokens=2)
