"""`attnkit serve` as a user runs it, in a process of its own: a model named on the command line,
an access log line per request, a 20 MB body refused without the server's memory growing, a
busy port said in one sentence before anything else, and SIGTERM ending it once the stream under
way has ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.bench_serve import announced_url, rss_mib
from tests.helpers import tiny_run


def _serve(run: Path, port: int = 0) -> subprocess.Popen:
    command = [sys.executable, "-m", "attnkit", "serve", f"shakespeare={run}",
               "--port", str(port), "--threads", "1", "--max-body-bytes", "100000"]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_command_serves_refuses_big_bodies_and_a_busy_port(tmp_path: Path) -> None:
    run = tiny_run(tmp_path / "run", "decoder")
    server = _serve(run)  # port 0: the system's choice, which no other test can take first
    url = announced_url(server)  # its first line: "serving shakespeare on URL (Ctrl-C stops)"
    port = int(url.rsplit(":", 1)[1])
    assert url == f"http://127.0.0.1:{port}" and port > 0
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.communicate()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
        assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["shakespeare"]
        before = rss_mib(server.pid)
        body = b'{"model": "shakespeare", "prompt": "' + b"x" * 20_000_000 + b'"}'
        for _ in range(3):
            refused = httpx.post(f"{url}/v1/completions", content=body, timeout=60,
                                 headers={"content-type": "application/json"})  # fmt: skip
            assert refused.status_code == 413
        assert rss_mib(server.pid) - before < 20  # nothing of the 60 MB stayed (9.6 GB did)

        second = _serve(run, port)  # the same port, taken
        out, err = second.communicate(timeout=120)
        assert second.returncode == 2 and "serving" not in out
        assert err.strip().endswith(
            f"port {port} on 127.0.0.1 is in use by another program; stop it or choose another "
            "--port"
        )
        assert "Traceback" not in err
        # SIGTERM while a stream is under way: the stream ends whole, then the server
        body = {"model": "shakespeare", "prompt": "a", "max_tokens": 300, "stream": True,
                "temperature": 0, "stream_options": {"include_usage": True}}  # fmt: skip
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as stream:
            lines = stream.iter_lines()
            next(lines)
            server.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        assert '"completion_tokens": 300' in rest[-2]
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=60)
    # uvicorn shuts down gracefully, then ends by the signal it was sent, as a shell expects
    assert server.returncode == -signal.SIGTERM and "Traceback" not in err
    assert '"GET /health" 200' in err and '"POST /v1/completions" 413' in err


def test_a_port_out_of_range_is_one_sentence(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "attnkit", "serve", str(tmp_path), "--port", "70000"],
        capture_output=True, text=True, timeout=120, env={**os.environ},
    )  # fmt: skip
    assert done.returncode == 2
    assert "--port must be from 0 to 65535" in done.stderr and "Traceback" not in done.stderr
