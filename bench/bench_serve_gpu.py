"""`attnkit serve` on a GPU under streaming clients, against transformers' continuous batching.

    python -m bench serve --device cuda                       # GPT-2-small, 1/8/32/128 clients
    python -m bench serve --device cuda --dtype bf16 --out bench/results/serve_gpu
    python -m bench.bench_serve_gpu --device cpu --shape tiny --clients 1 4   # a check on a CPU

One model shape, random weights (GPT-2-small: 12 blocks, d_model 768, a vocabulary of
50,257 words `w0 w1 ...`, so that every token is a word of text), served two ways in
one call, one after the other on the same device:

- attnkit: `attnkit serve RUN --device D --dtype T` in a subprocess; each client (asyncio,
  one connection each) sends streamed `/v1/completions` back to back, the prompt given as
  `--prompt-tokens` token ids, `--new-tokens` greedy tokens (the end token banned, so every
  output has its full length);
- transformers: `GPT2LMHeadModel` of the same shape in this process,
  `init_continuous_batching()`; each client adds a streaming request with the same prompt and
  length and reads its tokens as they come (`register_result_handler`).

Each client sends `--requests` requests. Reported per side and client count: generated tokens
a second (all clients' tokens over the wall time), time to first token measured by the client
from its request's start (p50, p99), errors, and the device's memory: the server process's
used memory from nvidia-smi (attnkit; sampled every 0.5 s: after warm-up, highest, last) and
torch's peak allocation (transformers, in this process); on a CPU, resident memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.bench_serve import announced_url, rss_mib
from bench.harness import opening

SHAPES = {  # (layers, d_model, heads, vocabulary words, max_len)
    "gpt2-small": (12, 768, 12, 50257, 1024),
    "tiny": (2, 64, 4, 500, 256),
}


def build_run(path: Path, shape: str) -> tuple[Path, int, int]:
    """A run of `shape` with random weights and a word tokenizer; (path, vocabulary, eos)."""
    import torch

    from attnkit.config import ModelConfig
    from attnkit.models import build_model
    from attnkit.run import RunFolder, save_pretrained, with_decoding_ids
    from attnkit.tokenizer import Tokenizer

    layers, d_model, heads, words, max_len = SHAPES[shape]
    text = " ".join(f"w{i}" for i in range(words - 5))  # the five specials make up the rest
    tokenizer = Tokenizer.train("word", texts=[text], vocab_size=words)
    config = ModelConfig.from_dict({
        "shape": "decoder", "vocab_size": tokenizer.vocab_size, "d_model": d_model,
        "n_heads": heads, "n_decoder_layers": layers, "d_ff": 4 * d_model,
        "activation": "gelu_tanh", "norm_position": "pre", "positional": "learned",
        "max_len": max_len, "scale_embeddings": False, "tie_embeddings": "decoder",
    })  # fmt: skip
    torch.manual_seed(0)
    save_pretrained(build_model(with_decoding_ids(config, tokenizer)), path)
    tokenizer.save(RunFolder(path).tokenizer)
    return path, tokenizer.vocab_size, tokenizer.eos_id


def prompts(vocab: int, length: int, n: int) -> list[list[int]]:
    """`n` prompts of `length` ids, the same for both sides (ids past the specials)."""
    return [[5 + (7919 * i + 104729 * j) % (vocab - 5) for j in range(length)] for i in range(n)]


def _summary(first: list[float], tokens: int, seconds: float, errors: int) -> dict:
    cuts = statistics.quantiles(first, n=100) if len(first) > 1 else [first[0]] * 99
    return {
        "tokens_per_s": tokens / seconds,
        "ttft_p50_ms": 1000 * statistics.median(first),
        "ttft_p99_ms": 1000 * cuts[98],
        "errors": errors,
        "tokens": tokens,
        "seconds": seconds,
    }


class Memory:
    """The device memory (or resident memory) of a process, sampled every 0.5 s."""

    def __init__(self, pid: int, device: str) -> None:
        self.pid, self.device, self.samples, self.stop = pid, device, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def read(self) -> float:
        if self.device == "cpu":
            return rss_mib(self.pid)
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True,
        ).stdout  # fmt: skip
        used = [float(m) for p, m in (row.split(",") for row in out.splitlines() if "," in row)
                if int(p) == self.pid]  # fmt: skip
        return used[0] if used else float("nan")

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            self.samples.append(self.read())

    def done(self) -> dict:
        self.stop.set()
        self.thread.join()
        samples = self.samples or [float("nan")]
        return {"memory_first_mib": samples[0], "memory_max_mib": max(samples),
                "memory_last_mib": samples[-1]}  # fmt: skip


async def attnkit_clients(url: str, clients: int, args: argparse.Namespace, eos: int,
                          ids: list[list[int]]) -> dict:  # fmt: skip
    first: list[float] = []
    counts = {"tokens": 0, "errors": 0}

    async def client(http: httpx.AsyncClient, c: int) -> None:
        for r in range(args.requests):
            body = {"model": "bench", "prompt": ids[(c * args.requests + r) % len(ids)],
                    "max_tokens": args.new_tokens, "temperature": 0, "stream": True,
                    "logit_bias": {str(eos): -100},
                    "stream_options": {"include_usage": True}}  # fmt: skip
            started, seen = time.perf_counter(), False
            async with http.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    counts["errors"] += 1
                    await response.aread()
                    continue
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        counts["errors"] += 1
                    elif chunk.get("usage"):
                        counts["tokens"] += chunk["usage"]["completion_tokens"]
                    elif not seen and chunk["choices"] and chunk["choices"][0]["text"]:
                        seen = True
                        first.append(time.perf_counter() - started)

    limits = httpx.Limits(max_connections=clients + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http, c) for c in range(clients)))
        seconds = time.perf_counter() - started
    return _summary(first, counts["tokens"], seconds, counts["errors"])


def attnkit_side(args: argparse.Namespace, run: Path, eos: int, ids: list[list[int]]) -> dict:
    command = [sys.executable, "-m", "attnkit", "serve", f"bench={run}", "--port", "0",
               "--device", args.device, "--dtype", args.dtype, "--no-access-log",
               "--max-batch", str(max(args.clients)), "--max-concurrent", "1024",
               "--max-new-tokens", str(args.new_tokens)]  # fmt: skip
    if args.threads:
        command += ["--threads", str(args.threads)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    results = {}
    try:
        url = announced_url(server)
        memory = Memory(server.pid, args.device)
        warm = argparse.Namespace(**{**vars(args), "requests": 1})
        asyncio.run(attnkit_clients(url, 2, warm, eos, ids))  # compiles, allocates
        for clients in args.clients:
            results[clients] = asyncio.run(attnkit_clients(url, clients, args, eos, ids))
            print(f"attnkit  {clients:>4} clients: {_line(results[clients])}", flush=True)
        results["memory"] = memory.done()
    finally:
        server.terminate()
        server.wait(timeout=60)
    return results


def transformers_side(args: argparse.Namespace, vocab: int, ids: list[list[int]]) -> dict:
    import torch
    from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

    layers, d_model, heads, _, max_len = SHAPES[args.shape]
    dtype = {"float32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab, n_positions=max_len, n_embd=d_model, n_layer=layers,
                        n_head=heads, eos_token_id=vocab - 1, bos_token_id=vocab - 1)  # fmt: skip
    model = GPT2LMHeadModel(config).to(args.device, dtype).eval()
    generation = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False,
                                  eos_token_id=vocab - 1, pad_token_id=0)  # fmt: skip
    manager = model.init_continuous_batching(generation_config=generation)
    manager.start()
    results = {}

    async def clients_of(clients: int, requests: int) -> dict:
        first: list[float] = []
        counts = {"tokens": 0, "errors": 0, "n": 0}

        async def client(c: int) -> None:
            for r in range(requests):
                queue: asyncio.Queue = asyncio.Queue()
                rid = f"c{c}-r{r}-{counts['n']}"
                counts["n"] += 1
                started, seen = time.perf_counter(), False
                manager.register_result_handler(rid, queue.put_nowait)
                manager.add_request(ids[(c * requests + r) % len(ids)], request_id=rid,
                                    max_new_tokens=args.new_tokens, streaming=True)  # fmt: skip
                while True:
                    out = await queue.get()
                    if out.error:
                        counts["errors"] += 1
                        break
                    if not seen and out.generated_tokens:
                        seen = True
                        first.append(time.perf_counter() - started)
                    if out.is_finished():
                        counts["tokens"] += len(out.generated_tokens)
                        break

        started = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        return _summary(first, counts["tokens"], time.perf_counter() - started, counts["errors"])

    try:
        asyncio.run(clients_of(2, 1))  # warm-up
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        for clients in args.clients:
            results[clients] = asyncio.run(clients_of(clients, args.requests))
            print(f"transformers {clients:>4} clients: {_line(results[clients])}", flush=True)
        if args.device.startswith("cuda"):
            results["memory"] = {"peak_allocated_mib": torch.cuda.max_memory_allocated() / 2**20}
    finally:
        manager.stop(block=True)
    return results


def _line(r: dict) -> str:
    return (f"{r['tokens_per_s']:,.0f} tokens/s, first token p50 {r['ttft_p50_ms']:,.0f} ms "
            f"p99 {r['ttft_p99_ms']:,.0f} ms, errors {r['errors']}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench serve --device cuda",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16", choices=("float32", "bf16", "fp16"))
    parser.add_argument("--shape", default="gpt2-small", choices=tuple(SHAPES))
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--requests", type=int, default=4, help="requests each client sends")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0, help="the server's torch threads")
    parser.add_argument("--sides", nargs="+", default=["attnkit", "transformers"])
    parser.add_argument("--out", type=Path, help="also write OUT.json")
    args = parser.parse_args(argv)
    header = opening(f"serve on {args.device} ({args.dtype}), {args.shape} random weights",
                     f"{args.prompt_tokens}-token prompts, {args.new_tokens} new tokens, "
                     f"{args.requests} requests a client")  # fmt: skip
    if args.device.startswith("cuda"):
        import torch

        print("GPU:", torch.cuda.get_device_name(), flush=True)
    results: dict = {"machine": header}
    with tempfile.TemporaryDirectory() as tmp:
        run, vocab, eos = build_run(Path(tmp) / "run", args.shape)
        ids = prompts(vocab, args.prompt_tokens, 4 * max(args.clients) * args.requests)
        if "attnkit" in args.sides:
            results["attnkit"] = attnkit_side(args, run, eos, ids)
        if "transformers" in args.sides:
            results["transformers"] = transformers_side(args, vocab, ids)
    for clients in args.clients:
        ours, theirs = results.get("attnkit", {}), results.get("transformers", {})
        if clients in ours and clients in theirs:
            ratio = ours[clients]["tokens_per_s"] / theirs[clients]["tokens_per_s"]
            print(f"{clients:>4} clients: attnkit / transformers tokens/s = {ratio:.2f}x")
    for side in ("attnkit", "transformers"):
        if "memory" in results.get(side, {}):
            print(f"{side} memory: {results[side]['memory']}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        data = {k: {str(c): v for c, v in r.items()} if isinstance(r, dict) else r
                for k, r in results.items()}  # fmt: skip
        args.out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
