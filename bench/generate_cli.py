"""`attnkit generate` at batch 1 against the Python call it runs, on one device (issue 52: the
command within 10% of the Python static path's tokens/s).

    python -m bench.generate_cli --device cuda --dtype bfloat16      # GPT-2-small, random weights
    python -m bench.generate_cli --device cpu --shape tiny           # a check on a CPU

One run folder of random weights (`bench_serve_gpu.build_run`: GPT-2-small's shape, a word
tokenizer, so each token prints as one word). The command runs in a subprocess twice, for
`--long` and for `--short` new tokens, greedy; loading the run and compiling the first steps
cost both runs the same, so its speed once warm is

    tokens/s = (n_long - n_short) / (t_long - t_short)

with n the words it printed (the tokens it chose). The Python side loads the same run in
this process, as the command does (`load_run`, the model cast to `--dtype`), warms the step, and
times `generate(..., cache_implementation=C)` for the same two lengths the same way. Both sides
take the cache `--cache` names (`auto`: static on a CUDA device, dynamic elsewhere).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_serve_gpu import SHAPES, build_run
from bench.harness import opening

PROMPT = "w1 w2 w3 w4 w5 w6 w7 w8"


def command_side(run: Path, args: argparse.Namespace, new: int) -> tuple[int, float]:
    """Words printed and seconds of one `attnkit generate` of `new` greedy tokens."""
    command = [sys.executable, "-m", "attnkit", "generate", str(run), "--prompt", PROMPT,
               "--greedy", "--max-new-tokens", str(new), "--device", args.device,
               "--dtype", args.dtype, "--cache-implementation", args.cache]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - start
    return len(done.stdout.split()) - len(PROMPT.split()), seconds


def python_side(run: Path, args: argparse.Namespace) -> dict[int, tuple[int, float]]:
    """Tokens chosen and seconds of `generate` for each length, warmed first."""
    import torch

    from attnkit.generation import GenerationConfig, generate
    from attnkit.run import load_run

    loaded = load_run(run, args.device)
    if args.dtype != "float32":
        loaded.model.to(getattr(torch, args.dtype))
    ids = torch.tensor([loaded.tokenizer.encode(PROMPT)], device=loaded.model.device)
    out = {}
    for new in (args.short, args.short, args.long):  # the first call warms (compiles) the step
        config = GenerationConfig(max_new_tokens=new, cache_implementation=args.cache)
        _sync(args.device)
        start = time.perf_counter()
        tokens = generate(loaded.model, ids, config=config).new_tokens()[0]
        _sync(args.device)
        out[new] = len(tokens), time.perf_counter() - start
    return out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def speed(long: tuple[int, float], short: tuple[int, float]) -> float:
    """Tokens a second once warm: the difference of two runs of different lengths."""
    return (long[0] - short[0]) / (long[1] - short[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.generate_cli",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--cache", default="auto", choices=("auto", "dynamic", "static"))
    parser.add_argument("--shape", default="gpt2-small", choices=tuple(SHAPES))
    parser.add_argument("--long", type=int, default=256)
    parser.add_argument("--short", type=int, default=32)
    args = parser.parse_args(argv)
    print(opening(f"attnkit generate against generate() on {args.device} ({args.dtype}, "
                  f"cache {args.cache})", f"{args.shape} random weights, batch 1, "
                  f"{args.short} and {args.long} greedy tokens"), flush=True)  # fmt: skip
    if args.device.startswith("cuda"):
        import torch

        print("GPU:", torch.cuda.get_device_name(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        run, _, _ = build_run(Path(tmp) / "run", args.shape)
        ours = {new: command_side(run, args, new) for new in (args.short, args.long)}
        theirs = python_side(run, args)
    command, python = (
        speed(ours[args.long], ours[args.short]),
        speed(theirs[args.long], theirs[args.short]),
    )
    for name, side in (("attnkit generate", ours), ("generate()", theirs)):
        print(f"{name}: {side[args.short][0]} tokens in {side[args.short][1]:.2f} s, "
              f"{side[args.long][0]} in {side[args.long][1]:.2f} s")  # fmt: skip
    print(f"tokens/s once warm: command {command:,.1f}, Python {python:,.1f}, "
          f"command / Python {command / python:.2f} (goal 0.90 or more)")  # fmt: skip


if __name__ == "__main__":
    main()
