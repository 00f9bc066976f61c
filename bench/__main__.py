"""`python -m bench`: every benchmark of attnkit, listed and run from one registry.

    python -m bench                          # the list, name and one line each (or `list`)
    python -m bench generate --threads 2     # one benchmark, with its own options
    python -m bench window linear --reps 1   # several in turn; the options go to each
    python -m bench train --help             # a benchmark's options
    python -m bench train --device cuda      # its GPU form, where it has one

Run it from the repository root. The registry is `BENCHMARKS` below: a name,
the module under bench/ that measures it, and the line the list shows. Each
module has a `main(argv)` that reads its own options (so it also runs alone,
`python -m bench.bench_window`), opens with the machine's line
(`bench.harness.opening`: the CPU, its vector flags, the kernels taken), and
measures with `bench/harness.py` (alternating sides, `Result`, the markdown
table and the files written with `--out`, whose place is bench/results/).
The peers, the reference implementations the benchmarks and the tests compare
against, are in bench/peers/. Adding a benchmark is a module with a `main` and
one line here.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    module: str
    about: str
    gpu_module: str = ""  # what `--device cuda` runs instead: the same work, measured on a GPU


BENCHMARKS = {
    "train": Benchmark(
        "bench.training",
        "training tokens/s against transformers, torch.nn.Transformer, nanoGPT (and MFU)",
        gpu_module="bench.train_gpu",
    ),
    "generate": Benchmark(
        "bench.bench_generate",
        "decoding tokens/s and memory against transformers' generate",
        gpu_module="bench.generate_gpu",
    ),
    "static-step": Benchmark(
        "bench.bench_static_step",
        "a decoding step on the static KV cache, compiled by torch.compile vs eager (CPU)",
    ),
    "onnx": Benchmark(
        "bench.bench_onnx", "greedy decoding of the exported ONNX graphs in ONNX Runtime vs attnkit"
    ),
    "linear": Benchmark(
        "bench.bench_linear", "a decoder's products on each path (float32, int8, bf16) vs F.linear"
    ),
    "attention": Benchmark(
        "bench.bench_attention", "causal attention on each fused kernel (attention_backend)"
    ),
    "linformer": Benchmark(
        "bench.bench_linformer", "Linformer's self-attention vs full attention, 1k-16k positions"
    ),
    "linformer-quality": Benchmark(
        "bench.linformer_quality", "Linformer vs full attention at equal steps: Multi30k's BLEU"
    ),
    "window": Benchmark(
        "bench.bench_window", "sliding-window attention block by block vs the window as a mask"
    ),
    "data": Benchmark(
        "bench.bench_data", "Multi30k: BPE training, encoding, padding of token-budget batches"
    ),
    "recipe": Benchmark(
        "bench.bench_recipe", "the Tiny Shakespeare recipe end to end vs a nanoGPT-style run"
    ),
    "variants": Benchmark(
        "bench.variants", "the model variants on Tiny Shakespeare, validation loss of each"
    ),
    "extrapolation": Benchmark(
        "bench.extrapolation",
        "train short, test long: perplexity at 1x-16x the trained length per positional method",
    ),
    "claims": Benchmark(
        "bench.claims",
        "the study notes' claims, 3 seeds: d_ff 1x-8x, learned vs sinusoidal, interpolation",
    ),
    "reward-scores": Benchmark(
        "bench.reward_scores", "a reward model's mean score of runs' greedy translations (RLHF)"
    ),
    "segment-recurrence": Benchmark(
        "bench.segment_recurrence",
        "Transformer-XL's segment recurrence vs a sliding window: validation loss, equal compute",
    ),
    "parity": Benchmark(
        "bench.interop_parity", "largest difference of imported HF models from transformers"
    ),
    "word2vec": Benchmark(
        "bench.bench_word2vec", "word2vec skip-gram and CBOW against gensim: words/s and quality"
    ),
    "nce": Benchmark(
        "bench.nce", "word2vec's noise-contrastive estimation beside negative sampling: quality"
    ),
    "attention-pooling": Benchmark(
        "bench.attention_pooling", "attention pooling with a learned query vs mean pooling"
    ),
    "glove": Benchmark(
        "bench.bench_glove", "GloVe beside word2vec, and against mittens: words/s and quality"
    ),
    "corpus-memory": Benchmark(
        "bench.bench_corpus_memory",
        "peak memory of a language-model run reading a 100 MB corpus in one line vs in lines",
    ),
    "serve": Benchmark(
        "bench.bench_serve",
        "attnkit serve: streaming clients, iteration-level batching vs one at a time",
        gpu_module="bench.bench_serve_gpu",
    ),
    "serve-isolation": Benchmark(
        "bench.bench_serve_isolation",
        "attnkit serve: a stream's longest gap beside a 32 x 256-token embedding request",
    ),
    "exposure": Benchmark(
        "bench.bench_exposure",
        "steps with scheduled sampling, self-critical and minimum risk vs teacher forcing",
    ),
    "trainer": Benchmark("bench.bench_trainer", "the Trainer's overhead over a bare training loop"),
    "fsdp": Benchmark(
        "bench.bench_fsdp",
        "one GPU: peak memory and tokens/s of FSDP and activation checkpointing modes",
    ),
    "llm": Benchmark(
        "bench.bench_llm",
        "the 1B shape on a GPU: decoding vs bandwidth, 8-bit weights, training MFU vs transformers",
    ),
    "memory": Benchmark(
        "bench.memory_plan",
        "on paper: memory per GPU of 1B, 7B, 8x7B with DDP, FSDP, checkpointing, LoRA",
    ),
    "peak": Benchmark("bench.peak", "the machine's matmul GFLOP/s on each of torch's paths"),
    "fault": Benchmark(
        "bench.fault_injection", "training killed by SIGKILL in checkpoint writes: all recovered?"
    ),
}


def listing() -> str:
    width = max(map(len, BENCHMARKS))
    lines = [f"  {name:<{width}}  {b.about}" for name, b in BENCHMARKS.items()]
    return "usage: python -m bench [NAME ...] [OPTIONS]\n\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    names = []
    while len(names) < len(args) and args[len(names)] in BENCHMARKS:
        names.append(args[len(names)])
    options = args[len(names) :]
    if not names:
        if options and options[0] not in ("list", "-h", "--help"):
            raise SystemExit(f"no benchmark {options[0]!r}\n\n{listing()}")
        print(listing())
        return
    device = argparse.ArgumentParser(add_help=False)
    device.add_argument("--device", default="cpu")
    on_gpu = device.parse_known_args(options)[0].device != "cpu"
    for name in names:
        benchmark = BENCHMARKS[name]
        module = benchmark.gpu_module if on_gpu and benchmark.gpu_module else benchmark.module
        importlib.import_module(module).main(options)


if __name__ == "__main__":
    main()
