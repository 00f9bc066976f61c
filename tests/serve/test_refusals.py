"""What cannot be computed is refused before it decodes, with a 400 naming the field; a
client's odd bytes are its own mistake (400, 401), never a 500; the operator's mistakes stop
the start in one sentence; a slow body or a huge prompt holds nothing for long."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from attnkit.errors import AttnkitError
from attnkit.run import RunFolder
from attnkit.serve.app import create_app
from attnkit.serve.runs import Served, served_runs
from attnkit.serve.settings import ServeSettings
from tests.helpers import tiny_run
from tests.serve.live import serving

CHAT = [{"role": "user", "content": "a dog"}]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"temperature": 1e-300}, "temperature"),
        ("/v1/completions", {"top_p": 1e-300}, "top_p"),
        ("/v1/completions", {"repetition_penalty": 1e-300}, "repetition_penalty"),
        ("/v1/chat/completions", {"temperature": 1e-40}, "temperature"),
        ("/v1/completions", {"logit_bias": {"²": 5}}, "logit_bias"),
        ("/v1/completions", {"logit_bias": {"٣": 5}}, "logit_bias"),
        ("/v1/translate", {"sample": True, "temperature": 1e-300}, "temperature"),
        ("/v1/translate", {"sample": True, "top_p": 1e-300}, "top_p"),
    ],
)
def test_values_that_cannot_be_computed_are_a_400_naming_them(
    served: list[Served], path: str, body: dict, param: str
) -> None:
    base = {
        "/v1/completions": {"model": "gpt", "prompt": "a dog"},
        "/v1/chat/completions": {"model": "gpt", "messages": CHAT},
        "/v1/translate": {"model": "mt", "texts": ["a dog"]},
    }[path]
    with TestClient(create_app(served)) as client:
        refused = client.post(path, json={**base, **body})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == param


def test_more_alternatives_than_the_vocabulary_has_are_a_400(tmp_path: Path) -> None:
    served = served_runs([f"gpt={tiny_run(tmp_path / 'gpt', 'decoder', kind='word')}"])
    vocab = served[0].model.config.vocab_size
    assert vocab < 20  # a word vocabulary of a few lines
    with TestClient(create_app(served)) as client:
        plain = client.post("/v1/completions", json={"model": "gpt", "prompt": "a", "logprobs": 20})
        echo = client.post(
            "/v1/completions",
            json={"model": "gpt", "prompt": "a dog", "logprobs": 20, "echo": True, "max_tokens": 0},
        )
        chat = client.post(
            "/v1/chat/completions",
            json={"model": "gpt", "messages": CHAT, "logprobs": True, "top_logprobs": 20},
        )
        fits = client.post("/v1/completions", json={"model": "gpt", "prompt": "a",
                                                    "logprobs": vocab})  # fmt: skip
    for answer, param in ((plain, "logprobs"), (echo, "logprobs"), (chat, "top_logprobs")):
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param
        assert f"the model has {vocab} tokens in all" in answer.json()["error"]["message"]
    assert fits.status_code == 200


def test_a_key_with_bytes_outside_ascii_is_a_401(served: list[Served]) -> None:
    app = create_app(served, ServeSettings(api_key="sekret"))
    with TestClient(app) as client:  # a fault in the server would raise here
        for sent in (b"Bearer \xff\xfe", "Bearer s\u00e9kret".encode(), b"\xc3\xa9"):
            answer = client.get("/v1/models", headers={"Authorization": sent})
            assert answer.status_code == 401
            assert answer.json()["error"]["code"] == "invalid_api_key"
        assert client.get("/v1/models", headers={"Authorization": "Bearer sekret"}).is_success


def test_the_operators_mistakes_stop_the_start_in_one_sentence(tmp_path: Path) -> None:
    run = tiny_run(tmp_path / "gpt", "decoder")
    for template, words in (
        ("{% include 'secrets.txt' %}", "uses {% include %} (line 1), which reads another file"),
        ("{% import 'm.j2' as m %}{{ m.x }}", "uses {% import %}"),
        ("{% extends 'base' %}", "uses {% extends %}"),
        ("{% for m in messages %}", "the chat template does not compile"),
    ):
        with pytest.raises(AttnkitError, match="model 'gpt' cannot be served") as err:
            served_runs([f"gpt={run}"], chat_template=template)
        assert words in str(err.value)
    RunFolder(run).tokenizer_config.write_text("{not json")
    with pytest.raises(AttnkitError, match=r"tokenizer_config\.json is not a JSON object"):
        served_runs([f"gpt={run}"])
    # the command says it once, before it listens
    bad = tmp_path / "chat.j2"
    bad.write_text("{% include 'x' %}")
    done = subprocess.run(
        [sys.executable, "-m", "attnkit", "serve", str(run), "--chat-template", str(bad),
         "--port", "0"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr and "serving" not in done.stdout
    assert "cannot be served" in done.stderr.strip().splitlines()[-1]


def test_a_chat_template_file_is_served(tmp_path: Path) -> None:
    run = tiny_run(tmp_path / "gpt", "decoder")
    template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    (gpt,) = served_runs([f"gpt={run}"], chat_template=template)
    assert gpt.chat.render([{"role": "user", "content": "a dog"}]) == "<a dog>"
    with TestClient(create_app([gpt])) as client:
        answer = client.post("/v1/chat/completions", json={"model": "gpt", "messages": CHAT,
                                                           "max_tokens": 2})  # fmt: skip
    assert answer.json()["usage"]["prompt_tokens"] == len(gpt.tokenizer.encode("<a dog>"))


def test_a_body_that_dribbles_in_is_a_408_and_frees_its_place(served: list[Served]) -> None:
    app = create_app(served, ServeSettings(body_timeout_s=0.5, max_concurrent=1))
    with serving(app) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as slow:
            slow.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"mo'
            )
            time.sleep(0.3)
            # still coming, byte by byte: the whole body is late all the same (on a loaded
            # machine the server may have answered and closed already)
            with contextlib.suppress(OSError):
                slow.sendall(b"del")
            answer = _whole_answer(slow)
        deadline = time.monotonic() + 10
        while app.state.server.in_flight:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    head, _, body = answer.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 408")
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert "did not arrive within 0.5 s" in json.loads(body)["error"]["message"]


def _whole_answer(connection: socket.socket) -> str:
    """An HTTP answer read until its body is whole (one recv may bring only its head)."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
        chunk = connection.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.decode()


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def test_a_prompt_too_long_is_refused_before_it_is_tokenized(
    served: list[Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenized = []
    original = Served.encode

    def counted(self: Served, texts: list[str], truncate: bool = False) -> list[list[int]]:
        tokenized.append(sum(len(t) for t in texts))
        return original(self, texts, truncate)

    monkeypatch.setattr(Served, "encode", counted)
    with TestClient(create_app(served)) as client:
        huge = client.post("/v1/completions", json={"model": "gpt", "prompt": "ab" * 1_000_000})
        cut = client.post("/v1/embeddings", json={"model": "bert", "input": "ab" * 1_000_000,
                                                  "truncate": True})  # fmt: skip
    error = huge.json()["error"]
    assert huge.status_code == 400 and error["code"] == "context_length_exceeded"
    assert "2,000,000 characters" in error["message"]
    assert cut.status_code == 200
    assert tokenized and max(tokenized) < 10_000  # the truncated input was cut before
