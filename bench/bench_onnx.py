"""Greedy decoding of an exported model in ONNX Runtime against attnkit's own, same weights.

(a) a GPT-2-shaped model (6 layers, d_model 512, 8 heads, vocab 8,000),
    batch 1 and batch 8, random 8-token prompts, 256 new tokens (no EOS);
(b) a Marian-shaped encoder-decoder (6+6 layers, d_model 512), batch 32,
    random sources of 20 tokens, at most 32 new tokens, stopping on EOS.

attnkit decodes with `generate` (float32, its KV cache); ONNX Runtime runs the
graphs `attnkit export onnx` writes (`save_onnx`), through the greedy loop of
`attnkit.interop.onnx_runtime.OnnxModel`, which feeds each step's present keys
and values back as the past. Both use the same number of threads. After a
warm-up the two take turns over repetitions, in reverse order every other
one; medians are reported, and the ratio is attnkit's tokens/s over ONNX
Runtime's. Each side's ids are compared as a sanity check. Writes OUT.json
and OUT.md with --out.

    python -m bench onnx --threads 2 --reps 5 --out bench/results/onnx
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import onnxruntime
import torch

from attnkit.generation import generate
from attnkit.interop.onnx_export import save_onnx
from attnkit.interop.onnx_runtime import OnnxModel
from attnkit.models import TransformerModel
from bench.harness import Result, alternate, finish, markdown_row, opening, seconds_per_call
from bench.peers.hf_models import gpt2_twins, marian_twins

VOCAB = 8000


def exported(model: TransformerModel, folder: Path, threads: int) -> tuple[OnnxModel, float]:
    """`model` exported into `folder` and opened in ONNX Runtime; the seconds the export took."""
    start = time.perf_counter()
    save_onnx(model, folder)
    return OnnxModel(folder, threads), time.perf_counter() - start


def measure(
    work: str,
    sides: dict[str, Callable[[], list[list[int]]]],
    reps: int,
    extra: dict[str, str],
) -> Result:
    """Tokens/s of each side, taking turns; the ids of ONNX Runtime checked against attnkit's."""
    outputs = {name: side() for name, side in sides.items()}
    tokens = {name: sum(map(len, ids)) for name, ids in outputs.items()}
    timed = [seconds_per_call(side) for side in sides.values()]
    seconds = dict(zip(sides, alternate(*timed, reps=reps, swap=True), strict=True))
    speed = {name: [tokens[name] / s for s in runs] for name, runs in seconds.items()}
    ours, theirs = outputs["attnkit"], outputs["ONNX Runtime"]
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    return Result(
        work,
        "tokens/s",
        speed["attnkit"],
        speed["ONNX Runtime"],
        "ONNX Runtime",
        extra={"same ids": f"{same}/{len(ours)} rows", **extra},
    )


def bench_gpt2(reps: int, new_tokens: int, threads: int, folder: Path) -> list[Result]:
    model = gpt2_twins(6, 512, 8, VOCAB, 1280)[0]
    runtime, export_s = exported(model, folder / "gpt2", threads)
    options = {"max_new_tokens": new_tokens, "eos_token_id": ()}
    results = []
    for batch in (1, 8):
        torch.manual_seed(batch)
        prompt = torch.randint(5, VOCAB, (batch, 8))
        sides = {
            "attnkit": lambda p=prompt: generate(model, p, **options).new_tokens(),
            "ONNX Runtime": lambda p=prompt: runtime.greedy(p, **options),
        }
        work = f"(a) GPT-2 greedy, batch {batch}"
        results.append(measure(work, sides, reps, {"export": f"{export_s:.1f} s"}))
    return results


def bench_marian(reps: int, new_tokens: int, threads: int, folder: Path) -> list[Result]:
    model = marian_twins(6, 512, 8, VOCAB, 512)[0]
    runtime, export_s = exported(model, folder / "marian", threads)
    torch.manual_seed(0)
    src = torch.randint(5, VOCAB, (32, 20))
    src[:, -1] = 2
    options = {"max_new_tokens": new_tokens, "eos_token_id": 2, "decoder_start_token_id": 0}
    sides = {
        "attnkit": lambda: generate(model, src, pad_token_id=0, **options).new_tokens(),
        "ONNX Runtime": lambda: runtime.greedy(src, **options),
    }
    work = "(b) Marian greedy, batch 32"
    return [measure(work, sides, reps, {"export": f"{export_s:.1f} s"})]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench onnx", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=256, help="(a): new tokens per prompt")
    parser.add_argument("--mt-new-tokens", type=int, default=32, help="(b): most new tokens")
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    header = opening(
        f"{args.threads} threads on both sides, {args.reps} reps, "
        f"ONNX Runtime {onnxruntime.__version__}, float32"
    )
    results = []
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        for part in (
            lambda: bench_gpt2(args.reps, args.new_tokens, args.threads, Path(folder)),
            lambda: bench_marian(args.reps, args.mt_new_tokens, args.threads, Path(folder)),
        ):
            for result in part():
                results.append(result)
                print(markdown_row(result), flush=True)
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
