"""attnkit serve under load: concurrent clients, with batching across requests and without.

    python -m bench serve --run runs/multi30k_de_en --clients 32 --seconds 60

`attnkit serve RUN` starts in a subprocess on 127.0.0.1 twice: batching as
shipped (requests with the same options gathered for `--wait-ms`, up to 16 a
decode) and without it (`--batch-wait-ms 0 --max-batch 1`: each request decodes
alone). Against each, `--clients` clients (asyncio, one connection each) send
greedy `/v1/translate` requests of one validation sentence each, back to back,
for `--seconds`. Reported: requests and generated tokens a second, p50 and p99
latency, errors (any status but 200), and the server's resident memory after
start-up and at the end (it must not grow with the requests served).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.harness import Result, finish, opening


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def load(url: str, model: str, texts: list[str], clients: int, seconds: float) -> dict:
    latencies: list[float] = []
    errors, tokens = 0, 0
    stop = time.perf_counter() + seconds

    async def client(i: int) -> None:
        nonlocal errors, tokens
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            n = i
            while time.perf_counter() < stop:
                body = {"model": model, "texts": [texts[n % len(texts)]], "max_new_tokens": 64}
                start = time.perf_counter()
                response = await http.post("/v1/translate", json=body)
                latencies.append(time.perf_counter() - start)
                if response.status_code != 200:
                    errors += 1
                else:
                    tokens += response.json()["usage"]["completion_tokens"]
                n += clients

    start = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = time.perf_counter() - start
    cuts = statistics.quantiles(latencies, n=100)
    return {"requests/s": len(latencies) / elapsed, "tokens/s": tokens / elapsed,
            "p50 ms": 1000 * cuts[49], "p99 ms": 1000 * cuts[98], "errors": errors,
            "requests": len(latencies)}  # fmt: skip


def serve(run: str, port: int, threads: int, extra: list[str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "attnkit", "serve", run, "--port", str(port)]
    server = subprocess.Popen([*command, "--threads", str(threads), *extra])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("the server did not start within 2 minutes")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench serve", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--run", default="runs/multi30k_de_en", help="an encoder-decoder run")
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--wait-ms", type=float, default=5)
    parser.add_argument("--threads", type=int, default=2, help="the server's torch threads")
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    if not (Path(args.run) / "model.safetensors").is_file():
        raise SystemExit(f"{args.run} holds no trained run; train the multi30k_de_en recipe first")
    with gzip.open(args.data_dir / "multi30k" / "val.de.gz", "rt", encoding="utf-8") as f:
        texts = f.read().splitlines()
    header = opening(f"{args.clients} clients x {args.seconds:g} s, greedy /v1/translate, "
                     f"{args.run}, server threads {args.threads}")  # fmt: skip
    model = Path(args.run).resolve().name
    measured = {}
    for name, extra in (("batched", ["--batch-wait-ms", str(args.wait_ms)]),
                        ("alone", ["--batch-wait-ms", "0", "--max-batch", "1"])):  # fmt: skip
        port = free_port()
        server = serve(args.run, port, args.threads, extra)
        try:
            rss_start = rss_mib(server.pid)
            url = f"http://127.0.0.1:{port}"
            measured[name] = asyncio.run(load(url, model, texts, args.clients, args.seconds))
            measured[name]["rss start MiB"], measured[name]["rss end MiB"] = (
                rss_start,
                rss_mib(server.pid),
            )
            metrics = httpx.get(f"{url}/metrics").text
            batches = [x for x in metrics.splitlines() if x.startswith("attnkit_batches_total")]
            measured[name]["batches"] = float(batches[0].split()[-1])
        finally:
            server.terminate()
            server.wait(timeout=30)
        print(name, {k: round(v, 1) for k, v in measured[name].items()}, flush=True)
    results = []
    for key, higher in (
        ("requests/s", True),
        ("tokens/s", True),
        ("p50 ms", False),
        ("p99 ms", False),
    ):
        ours, alone = [measured["batched"][key]], [measured["alone"][key]]
        unit = key.split()[-1]
        results.append(Result(key, unit, ours, alone, "each alone", higher_is_better=higher))
    counts = ("errors", "requests", "batches", "rss start MiB", "rss end MiB")
    extra = {k: f"{measured['batched'][k]:.0f} / {measured['alone'][k]:.0f}" for k in counts}
    results.append(Result("errors", "count", [measured["batched"]["errors"]], extra=extra))
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
