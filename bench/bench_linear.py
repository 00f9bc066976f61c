"""A decoder's matrix products: `F.linear` against each of attnkit's paths, float32 and lower.

The matrices are those of one decoding step of the GPT-2-shaped benchmark
model (6 layers, d_model 512, d_ff 2048, vocab 8,000): each row count runs
all 25 products, the paths alternating over repetitions after a warm-up;
medians are reported (microseconds for the 25), with the speed-up over
`F.linear` of: the product over the weight's halves (a view of the weight),
the few-row C kernel (`attnkit/kernels/few_rows.c`), oneDNN's float32 (AVX-512
CPUs), attnkit's `Linear` as it routes, int8 (`Int8Linear` as it ships: the
C kernel `int8_rows.c` up to its rows, then `_int_mm` or FBGEMM; and that
many-row product alone), int8 weights with float32 activations (torch's
`_weight_int8pack_mm`, which attnkit does not use), and bf16 where the CPU
has it. This is what sets `attnkit.nn.linear.FEW_ROWS` and `KERNEL_ROWS`,
`attnkit.kernels.int8_rows.KERNEL_ROWS` and the compute types' paths.

    python -m bench linear --threads 2
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from attnkit.kernels import few_rows, onednn
from attnkit.nn import Linear
from attnkit.nn.compute_type import BFloat16Linear, refusal
from attnkit.nn.int8_linear import Int8Linear, Int8Path, int8_path, quantize_per_channel
from bench.harness import (
    Result,
    alternate,
    finish,
    markdown_row,
    opening,
    seconds_per_call,
)

SHAPES = [(1536, 512), (512, 512), (2048, 512), (512, 2048)] * 6 + [(8000, 512)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench linear", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    weights = [torch.randn(shape) * 0.02 for shape in SHAPES]
    biases = [torch.zeros(shape[0]) for shape in SHAPES]
    # attnkit's own layer, so its path over the weight's halves is measured as it ships.
    layers = [Linear(w.shape[1], w.shape[0]) for w in weights]
    for layer, w, b in zip(layers, weights, biases, strict=True):
        layer.weight.data.copy_(w)
        layer.bias.data.copy_(b)
    if not few_rows.available():
        raise SystemExit("the few-row kernel is not built on this machine (see the warning)")
    header = opening(f"{args.threads} threads, {args.reps} reps")
    cpu = torch.device("cpu")
    int8 = {}
    if refusal("int8", cpu) is None:
        # as it ships (the C kernel up to its rows), and its many-row product for every call
        shipped = int8_path()
        int8[f"int8 (Int8Linear: {shipped.kernel} kernel, {shipped.many})"] = shipped
        int8[f"int8 ({shipped.many} alone)"] = Int8Path(None, shipped.many, shipped.levels)
        if shipped.many != "fbgemm" and "fbgemm" in torch.backends.quantized.supported_engines:
            int8["int8 (fbgemm alone, 7-bit rows)"] = Int8Path(None, "fbgemm", 63)
    int8 = {name: [Int8Linear(layer, path) for layer in layers] for name, path in int8.items()}
    bf16 = [BFloat16Linear(layer) for layer in layers] if refusal("bf16", cpu) is None else None
    weight_only = [quantize_per_channel(w) for w in weights]
    results = []
    with torch.no_grad():
        for rows in args.rows:
            inputs = {d: torch.randn(rows, d) for d in (512, 2048)}

            def each(product, modules=layers, inputs=inputs):
                return lambda: [
                    product(m, inputs[w.shape[1]]) for m, w in zip(modules, weights, strict=True)
                ]

            paths = {
                "F.linear": each(lambda m, x: F.linear(x, m.weight, m.bias)),
                "weight halves": each(lambda m, x: m._halves_product(x, m.weight, m.bias)),
                "few-row kernel": each(lambda m, x: few_rows.linear(x, m.weight, m.bias)),
                "attnkit Linear": each(lambda m, x: m(x)),
                "int8 weights only (_weight_int8pack_mm)": each(
                    lambda m, x: torch._weight_int8pack_mm(x, *m), weight_only
                ),
            }
            if onednn.enabled():
                paths["oneDNN float32"] = each(lambda m, x: onednn.linear(x, m.weight, m.bias))
            for name, modules in int8.items():
                paths[name] = each(lambda m, x: m(x), modules)
            if bf16 is not None:
                paths["bf16 (BFloat16Linear)"] = each(lambda m, x: m(x), bf16)
            calls = max(2, 64 // rows)
            for path in paths.values():  # the warm-up, and the probes of attnkit's Linear
                path()
            timed = (seconds_per_call(path, calls) for path in paths.values())
            seconds = alternate(*timed, reps=args.reps, warmup=0, swap=True)
            us = {name: [s * 1e6 for s in side] for name, side in zip(paths, seconds, strict=True)}
            for name, side in list(us.items())[1:]:
                results.append(
                    Result(
                        f"{rows} rows, {name}",
                        "µs",
                        side,
                        us["F.linear"],
                        "F.linear",
                        higher_is_better=False,
                    )
                )
                print(markdown_row(results[-1]), flush=True)
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
