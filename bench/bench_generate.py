"""Decoding speed of attnkit against Hugging Face `generate` and CTranslate2, on identical weights.

(a) greedy tokens/s of a GPT-2-shaped model (6 layers, d_model 512, 8 heads,
    vocab 8,000), batch 1 and batch 8, 256 new tokens;
(b) beam-4 translation tokens/s of a Marian-shaped model (6+6 layers,
    d_model 512), batch 32, sources of 20 tokens;
    each of (a) and (b) with attnkit in every compute type this CPU runs
    (float32, int8, bf16), transformers in float32, and CTranslate2 in float32
    and int8 (the twin exported as `attnkit export hf` does, then converted by
    CTranslate2's own converter), and the weights each holds resident;
(c) attnkit's time per new token at position 1,000 against position 10, with
    the KV cache and without it (a full forward per token);
(d) the peak memory one generation at batch 32 adds, (a) and (b), each side
    in its own process.

All sides run in one process with the same thread count; after a warm-up the
sides take turns over repetitions, in reverse order every other one, and
medians are reported, with ratios. Each side's ids are compared with attnkit
float32's as a sanity check. Writes OUT.json and OUT.md with --out.

    python -m bench generate --threads 2 --reps 5 --out bench/results/generate
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import ctranslate2
import torch
import transformers

from attnkit.generation import generate
from attnkit.nn.compute_type import (
    BFloat16Linear,
    Int8Linear,
    convert,
    linear_weight_bytes,
    refusal,
    resolve,
)
from bench.harness import (
    Result,
    alternate,
    finish,
    markdown_row,
    opening,
    peak_rss_added_mib,
    rss_in_subprocess,
    seconds_per_call,
)
from bench.peers import ctranslate2_models
from bench.peers.hf_models import before_eos, gpt2_twins, marian_twins

VOCAB = 8000


def gpt2_sides(
    models: dict[str, object], batch: int, new_tokens: int
) -> dict[str, Callable[[], list[list[int]]]]:
    """Greedy generation of `new_tokens` after random 8-token prompts, on each side.

    Each side returns the new ids, row by row, for the sanity check.
    """
    torch.manual_seed(batch)
    prompt = torch.randint(5, VOCAB - 1, (batch, 8))
    mask = torch.ones_like(prompt)
    words = [[ctranslate2_models.token(i) for i in row] for row in prompt.tolist()]

    def ours(model):
        options = {"max_new_tokens": new_tokens, "eos_token_id": ()}
        return lambda: generate(model, prompt, mask, **options).sequences[:, 8:].tolist()

    def hf(model):
        options = {"do_sample": False, "eos_token_id": None, "pad_token_id": 0}
        return lambda: model.generate(
            prompt, attention_mask=mask, max_new_tokens=new_tokens, **options
        )[:, 8:].tolist()

    def ct2(generator):
        # min_length = max_length: no early stop on the token the converter calls EOS.
        options = {"max_length": new_tokens, "min_length": new_tokens, "sampling_topk": 1}
        return lambda: [
            _ids(r.sequences[0])
            for r in generator.generate_batch(words, include_prompt_in_result=False, **options)
        ]

    return _sides(models, ours, hf, ct2)


def marian_sides(
    models: dict[str, object], new_tokens: int
) -> dict[str, Callable[[], list[list[int]]]]:
    """Beam-4 translation of 32 random 20-token sources (EOS last), on each side."""
    torch.manual_seed(0)
    src = torch.randint(5, VOCAB - 1, (32, 20))  # not VOCAB - 1: CTranslate2 drops it (<pad>)
    src[:, -1] = 2
    mask = torch.ones_like(src)
    words = [[ctranslate2_models.token(i) for i in row[:-1]] for row in src.tolist()]
    options = {"num_beams": 4, "max_new_tokens": new_tokens}

    def ours(model):
        start = {"decoder_start_token_id": 0, "pad_token_id": 0}
        return lambda: before_eos(
            [row[1:] for row in generate(model, src, mask, **start, **options).sequences.tolist()],
            2,
        )

    def hf(model):
        return lambda: before_eos(
            [row[1:] for row in model.generate(src, attention_mask=mask, **options).tolist()], 2
        )

    def ct2(translator):
        return lambda: [
            _ids(r.hypotheses[0])
            for r in translator.translate_batch(words, beam_size=4, max_decoding_length=new_tokens)
        ]

    return _sides(models, ours, hf, ct2)


def _ids(tokens: list[str]) -> list[int]:
    return [int(t[1:]) for t in tokens]


def _sides(models: dict[str, object], ours, hf, ct2) -> dict[str, Callable[[], list[list[int]]]]:
    makers = {"attnkit": ours, "transformers": hf, "CTranslate2": ct2}
    # A side's name is its maker and, after a space, its compute type.
    return {side: makers[side.split()[0]](model) for side, model in models.items()}


def compute_types() -> list[str]:
    """float32, and int8 and bf16 where this CPU runs them."""
    return ["float32"] + [t for t in ("int8", "bf16") if refusal(t, torch.device("cpu")) is None]


def all_models(ours, hf, threads: int, folder: Path) -> dict[str, object]:
    """attnkit in each compute type, transformers in float32, CTranslate2 in float32 and int8.

    Keys are "SIDE TYPE"; CTranslate2's models are converted into `folder`.
    """
    models: dict[str, object] = {}
    for compute_type in compute_types():
        model = copy.deepcopy(ours)
        convert(model, compute_type)
        models[f"attnkit {compute_type}"] = model
    models["transformers float32"] = hf
    open_ct2 = (
        ctranslate2_models.translator
        if ours.config.shape == "encoder-decoder"
        else (ctranslate2_models.generator)
    )
    for quantization in ("float32", "int8"):
        converted = ctranslate2_models.convert(ours, folder / quantization, quantization)
        models[f"CTranslate2 {quantization}"] = open_ct2(converted, quantization, threads)
    return models


def gpt2_models():
    ours, hf = gpt2_twins(6, 512, 8, VOCAB, 1280)
    hf.generation_config.eos_token_id = None
    return ours, hf


def marian_models():
    return marian_twins(6, 512, 8, VOCAB, 512)


def measure(work: str, sides: dict[str, Callable[[], list[list[int]]]], reps: int) -> list[Result]:
    """Tokens/s of every side, taking turns; one row per attnkit compute type.

    Each row sets attnkit in that type against transformers (float32), and gives
    CTranslate2 at the same type beside it (float32 for bf16, which CTranslate2
    does not run on a CPU); `same ids` compares each side's ids with attnkit
    float32's.
    """
    outputs = {name: side() for name, side in sides.items()}
    reference = outputs["attnkit float32"]
    tokens = {name: sum(len(row) for row in ids) for name, ids in outputs.items()}
    timed = [seconds_per_call(side) for side in sides.values()]
    seconds = dict(zip(sides, alternate(*timed, reps=reps, swap=True), strict=True))
    speed = {name: [tokens[name] / s for s in runs] for name, runs in seconds.items()}

    def same(name: str) -> str:
        rows = sum(a == b for a, b in zip(outputs[name], reference, strict=True))
        return f"{rows}/{len(reference)} rows"

    results = []
    for name in (n for n in sides if n.startswith("attnkit")):
        compute_type = name.split()[1]
        ct2 = f"CTranslate2 {'float32' if compute_type == 'bf16' else compute_type}"
        ratio = statistics.median(speed[name]) / statistics.median(speed[ct2])
        results.append(
            Result(
                f"{work}, {name}",
                "tokens/s",
                speed[name],
                speed["transformers float32"],
                "transformers",
                extra={
                    f"{ct2} tokens/s": f"{statistics.median(speed[ct2]):,.1f}",
                    f"vs {ct2}": f"{ratio:.2f}x",
                    "same ids as attnkit float32": same(name),
                    f"{ct2} same ids": same(ct2),
                    "transformers same ids": same("transformers float32"),
                },
            )
        )
    return results


def bench_gpt2(reps: int, new_tokens: int, threads: int) -> list[Result]:
    results = []
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        models = all_models(*gpt2_models(), threads, Path(folder))
        for batch in (1, 8):
            work = f"(a) GPT-2 greedy, batch {batch}"
            results += measure(work, gpt2_sides(models, batch, new_tokens), reps)
        results.append(weights_resident("(a) GPT-2", models, Path(folder)))
    return results


def bench_marian(reps: int, new_tokens: int, threads: int) -> list[Result]:
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        models = all_models(*marian_models(), threads, Path(folder))
        work = "(b) Marian beam 4, batch 32"
        return [
            *measure(work, marian_sides(models, new_tokens), reps),
            weights_resident("(b) Marian", models, Path(folder)),
        ]


def weights_resident(work: str, models: dict[str, object], folder: Path) -> Result:
    """MiB of weights each of attnkit's types and CTranslate2's holds resident.

    attnkit's: every parameter and buffer outside the linear layers (embeddings,
    norms, tables; tied tensors once), which stay float32, and the linear layers'
    weights in their type; CTranslate2's: its model.bin.
    """

    def mib(model) -> float:
        linear = (torch.nn.Linear, Int8Linear, BFloat16Linear)
        inside = {
            t.data_ptr()
            for m in model.modules()
            if isinstance(m, linear)
            for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]
        }
        rest = {
            t.data_ptr(): t.numel() * t.element_size()
            for t in [*model.parameters(), *model.buffers()]
            if t.data_ptr() not in inside
        }
        return (linear_weight_bytes(model) + sum(rest.values())) / 2**20

    ours = {name: mib(m) for name, m in models.items() if name.startswith("attnkit")}
    theirs = {q: ctranslate2_models.weight_bytes(folder / q) / 2**20 for q in ("float32", "int8")}
    return Result(
        f"{work}, weights resident",
        "MiB",
        [ours["attnkit float32"]],
        higher_is_better=False,
        extra={
            **{f"{name}": f"{v:.1f}" for name, v in ours.items()},
            **{f"CTranslate2 {q}": f"{v:.1f}" for q, v in theirs.items()},
        },
    )


# Memory: what one generation at batch 32 adds to the resident set of a process that
# holds both models. Each side runs in a fresh process so neither inherits the other's
# freed-but-resident pages; the kernel's peak (VmHWM) is reset just before generating.
MEMORY_WORKS = {
    "gpt2-greedy-batch32": lambda new_tokens: gpt2_sides(_float32(gpt2_models()), 32, new_tokens),
    "marian-beam4-batch32": lambda new_tokens: marian_sides(_float32(marian_models()), new_tokens),
}


def _float32(twins) -> dict[str, object]:
    return dict(zip(("attnkit", "transformers"), twins, strict=True))


@torch.no_grad()
def generation_memory_mib(work: str, side: str, new_tokens: int) -> float:
    """Peak resident MiB that one generation adds above the loaded models (Linux only)."""
    return peak_rss_added_mib(MEMORY_WORKS[work](new_tokens)[side])


def bench_memory(threads: int, new_tokens: dict[str, int]) -> list[Result]:
    """(d): what one generation adds, each side measured in a process of its own."""

    def mib(work: str, side: str) -> list[float]:
        options = ("--threads", str(threads), "--rss", work, side)
        return [
            rss_in_subprocess(
                "bench.bench_generate", *options, "--new-tokens", str(new_tokens[work])
            )
        ]

    return [
        Result(
            f"(d) {work}, memory one generation adds",
            "MiB",
            mib(work, "attnkit"),
            mib(work, "transformers"),
            "transformers",
            higher_is_better=False,
        )
        for work in MEMORY_WORKS
    ]


@torch.no_grad()
def bench_positions(reps: int, steps: int = 16) -> list[Result]:
    """attnkit ms per new token at positions 10 and 1,000, with the cache and with full forwards.

    The four measurements take turns within each repetition, after a first
    round as warm-up, so a change in the machine's load touches all of them
    alike; medians are reported.
    """
    model = gpt2_models()[0]

    def cached(prompt: torch.Tensor) -> float:
        cache = model.new_cache(prompt, capacity=prompt.shape[1] + steps)
        model.decode_step(prompt, cache)
        next_id = prompt[:, -1:]
        start = time.perf_counter()
        for _ in range(steps):
            model.decode_step(next_id, cache)
        return time.perf_counter() - start

    def uncached(prompt: torch.Tensor) -> float:
        ids = prompt
        start = time.perf_counter()
        for _ in range(steps):
            model(ids).logits[:, -1]
            ids = torch.cat([ids, ids[:, -1:]], dim=1)
        return time.perf_counter() - start

    prompts = {position: torch.randint(5, VOCAB, (1, position)) for position in (10, 1000)}
    sides = {
        (name, position): lambda fn=fn, prompt=prompt: fn(prompt) / steps * 1000
        for position, prompt in prompts.items()
        for name, fn in (("cached", cached), ("uncached", uncached))
    }
    times = dict(zip(sides, alternate(*sides.values(), reps=reps), strict=True))
    results = []
    for name in ("cached", "uncached"):
        at10, at1000 = times[name, 10], times[name, 1000]
        slower = statistics.median(at1000) / statistics.median(at10)
        results.append(Result(f"(c) {name}, position 10", "ms per new token", at10))
        results.append(
            Result(
                f"(c) {name}, position 1000",
                "ms per new token",
                at1000,
                extra={"over position 10": f"x{slower:.2f}"},
            )
        )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench generate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=256, help="(a): new tokens per prompt")
    parser.add_argument("--beam-new-tokens", type=int, default=32, help="(b): most new tokens")
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    parser.add_argument(
        "--rss", nargs=2, metavar=("WORK", "SIDE"), help="internal: one side's generation memory"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.rss:
        print(generation_memory_mib(*args.rss, args.new_tokens))
        return
    auto = resolve("auto", torch.device("cpu"))
    header = opening(
        f"{args.threads} threads, {args.reps} reps, transformers {transformers.__version__}, "
        f"CTranslate2 {ctranslate2.__version__}; attnkit compute types {compute_types()}, "
        f"auto as {auto}"
    )
    new_tokens = {
        "gpt2-greedy-batch32": args.new_tokens,
        "marian-beam4-batch32": args.beam_new_tokens,
    }
    results = []
    for part in (
        lambda: bench_gpt2(args.reps, args.new_tokens, args.threads),
        lambda: bench_marian(args.reps, args.beam_new_tokens, args.threads),
        lambda: bench_positions(args.reps),
        lambda: bench_memory(args.threads, new_tokens),
    ):
        for result in part():
            results.append(result)
            print(markdown_row(result), flush=True)
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
