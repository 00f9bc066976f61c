"""attnkit serve under streaming clients: iteration-level batching against one output at a time.

    python -m bench serve --run runs/tinyshakespeare_char_5min --clients 32 --seconds 60
    python -m bench serve --url http://127.0.0.1:8000 --model shakespeare --clients 32

Two-phase (no --url): `attnkit serve RUN` starts in a subprocess on 127.0.0.1
twice, as shipped (`--max-batch 32`: outputs join and leave the running batch at
each decoding step) and one output at a time (`--max-batch 1`: the others wait
their turn). Against each, `--clients` clients (asyncio, one connection each) send
streamed `/v1/completions` back to back for `--seconds`: a prompt of `--prompt-chars`
characters from the corpus (each client its own place), `--max-tokens` new tokens
sampled at temperature 0.8, usage asked in the stream. With --url, the same load
runs against a server already running (`--pid` names its process, for its memory).

Reported: generated tokens a second (from each stream's usage), requests a second,
time to first token (request sent to first text received) and whole-request latency
at p50 and p99, errors (a status other than 200, or an error event), and the
server's resident memory sampled every 5 s (all printed): after the warm-up, at the end,
and the highest of each half of the run; flat memory is a second half no higher than the
first (the allocator's pools fill during the first minute or two, then stay).
The client runs in this process: on a small machine it shares the cores with the
server, so the figures are the server's with a real client beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.harness import Result, finish, opening

WARMUP_S = 5.0
RSS_EVERY_S = 5.0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def one_stream(http: httpx.AsyncClient, body: dict) -> tuple[float, float, int, bool]:
    """(seconds to the first text, seconds in all, tokens generated, ok) of one stream."""
    start = time.perf_counter()
    first, tokens, ok = None, 0, True
    async with http.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return float("nan"), time.perf_counter() - start, 0, False
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                ok = False
            elif chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif first is None and chunk["choices"] and chunk["choices"][0]["text"]:
                first = time.perf_counter() - start
    return (first or float("nan")), time.perf_counter() - start, tokens, ok


async def load(url: str, model: str, prompts: list[str], args: argparse.Namespace,
               pid: int | None) -> dict:  # fmt: skip
    """`args.clients` streaming clients for `args.seconds` (after a warm-up), measured."""
    first_tokens: list[float] = []
    latencies: list[float] = []
    counts = {"errors": 0, "tokens": 0, "requests": 0}
    rss: list[tuple[float, float]] = []
    warm = time.perf_counter() + WARMUP_S
    stop = warm + args.seconds

    async def client(i: int) -> None:
        rng = random.Random(i)
        async with httpx.AsyncClient(base_url=url, timeout=300) as http:
            while time.perf_counter() < stop:
                body = {"model": model, "prompt": rng.choice(prompts), "stream": True,
                        "max_tokens": args.max_tokens, "temperature": 0.8,
                        "stream_options": {"include_usage": True}}  # fmt: skip
                sent = time.perf_counter()
                try:
                    first, seconds, tokens, ok = await one_stream(http, body)
                except httpx.HTTPError:
                    first, seconds, tokens, ok = float("nan"), 0.0, 0, False
                if sent < warm:
                    continue
                counts["requests"] += 1
                counts["errors"] += not ok
                counts["tokens"] += tokens
                latencies.append(seconds)
                if first == first:  # not NaN
                    first_tokens.append(first)

    async def memory() -> None:
        while pid is not None and time.perf_counter() < stop:
            if time.perf_counter() >= warm:
                rss.append((time.perf_counter() - warm, rss_mib(pid)))
            await asyncio.sleep(RSS_EVERY_S)

    await asyncio.gather(memory(), *(client(i) for i in range(args.clients)))
    elapsed = time.perf_counter() - warm  # the last requests end after `stop`
    ttft, whole = _cuts(first_tokens), _cuts(latencies)
    out = {
        "tokens/s": counts["tokens"] / elapsed,
        "requests/s": counts["requests"] / elapsed,
        "ttft p50 ms": 1000 * ttft[49], "ttft p99 ms": 1000 * ttft[98],
        "latency p50 ms": 1000 * whole[49], "latency p99 ms": 1000 * whole[98],
        **counts,
    }  # fmt: skip
    if rss:
        values = [m for _, m in rss]
        print("rss MiB every", RSS_EVERY_S, "s:", " ".join(f"{m:.0f}" for m in values), flush=True)
        half = len(values) // 2
        out.update({"rss start MiB": values[0], "rss end MiB": values[-1],
                    "rss max 1st half MiB": max(values[: half or 1]),
                    "rss max 2nd half MiB": max(values[half:])})  # fmt: skip
    return out


def _cuts(values: list[float]) -> list[float]:
    if len(values) < 2:
        return [float("nan")] * 99
    return statistics.quantiles(values, n=100)


def announced_url(server: subprocess.Popen) -> str:
    """The address a server started with `--port 0` took, from its first line ("serving NAMES
    on URL (Ctrl-C stops)"): the system picks a free port, so no other process can take it
    between a look for a free one and the server's start."""
    line = server.stdout.readline()
    if " on http://" not in line:
        server.kill()
        raise SystemExit(f"the server did not start: {line or server.communicate()[1]}")
    return line.split(" on ", 1)[1].split()[0]


def serve(run: str, threads: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    """`attnkit serve` of `run` on a free port, once it is ready; the process and its URL."""
    command = [sys.executable, "-m", "attnkit", "serve", f"bench={run}", "--port", "0",
               "--threads", str(threads), "--no-access-log", *extra]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    url = announced_url(server)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return server, url
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("the server did not start within 2 minutes")


def corpus_prompts(path: Path, chars: int, n: int = 512) -> list[str]:
    text = path.read_text(encoding="utf-8")
    rng = random.Random(0)
    return [text[i : i + chars] for i in (rng.randrange(len(text) - chars) for _ in range(n))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench serve", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--run", default="runs/tinyshakespeare_char_5min", help="a decoder run")
    parser.add_argument("--url", help="a running server to load instead (one phase)")
    parser.add_argument("--model", default="bench", help="the model's name on --url's server")
    parser.add_argument("--pid", type=int, help="the --url server's process, for its memory")
    parser.add_argument("--corpus", type=Path,
                        default=Path("../shared/data/tinyshakespeare/input.txt"))  # fmt: skip
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--prompt-chars", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-batch", type=int, default=32, help="the batched server's rows")
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    prompts = corpus_prompts(args.corpus, args.prompt_chars)
    where = args.url or f"{args.run}, server threads {args.threads}"
    work = f"{args.prompt_chars} characters + {args.max_tokens} tokens"
    header = opening(
        f"{args.clients} streaming clients x {args.seconds:g} s, /v1/completions of {work}, {where}"
    )
    if args.url:
        measured = asyncio.run(load(args.url, args.model, prompts, args, args.pid))
        print(json.dumps({k: round(v, 1) for k, v in measured.items()}))
        finish([_result("tokens/s", measured, None)], header, args.out)
        return
    if not (Path(args.run) / "model.safetensors").is_file():
        raise SystemExit(f"{args.run} holds no trained run; train the "
                         "tinyshakespeare_char_5min recipe first")  # fmt: skip
    measured = {}
    for name, batch in (("batched", args.max_batch), ("alone", 1)):
        server, url = serve(args.run, args.threads, ["--max-batch", str(batch)])
        try:
            measured[name] = asyncio.run(load(url, "bench", prompts, args, server.pid))
        finally:
            server.terminate()
            server.wait(timeout=60)
        print(name, {k: round(v, 1) for k, v in measured[name].items()}, flush=True)
    compared = {"tokens/s": True, "requests/s": True, "ttft p50 ms": False,
                "ttft p99 ms": False, "latency p99 ms": False}  # fmt: skip
    results = [
        _result(key, measured["batched"], measured["alone"], higher)
        for key, higher in compared.items()
    ]
    counts = ("errors", "requests", "rss start MiB", "rss end MiB", "rss max 1st half MiB",
              "rss max 2nd half MiB")  # fmt: skip
    extra = {k: f"{measured['batched'][k]:.1f} / {measured['alone'][k]:.1f}" for k in counts}
    results.append(Result("errors", "count", [measured["batched"]["errors"]], extra=extra))
    finish(results, header, args.out)


def _result(key: str, ours: dict, alone: dict | None, higher: bool = True) -> Result:
    unit = key.split()[-1]
    if alone is None:
        extra = {k: f"{v:.1f}" for k, v in ours.items() if k != key}
        return Result(key, unit, [ours[key]], extra=extra)
    return Result(key, unit, [ours[key]], [alone[key]], "one at a time", higher_is_better=higher)


if __name__ == "__main__":
    main()
