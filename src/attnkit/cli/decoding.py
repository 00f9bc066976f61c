"""The command line's decoding options: what `translate`, `generate` and `eval` share.

The run to load (folder, device, threads), and the options of `GenerationConfig`
(greedy, beam, sampling, the monotonic window) as flags and back.
"""

from __future__ import annotations

import argparse

# The most new tokens one command decodes. A decoder-only model slides its context past
# max_len, so nothing else bounds `--max-new-tokens`, and its history is kept whole (8 bytes
# a token a row): 10^29 overflowed torch, 10^9 would take 8 GB a row.
MAX_NEW_TOKENS = 1_000_000


def load_run_of(args: argparse.Namespace):
    """The model and tokenizer of RUN_DIR, on the asked device, with the asked threads."""
    import torch

    from attnkit.checks import check, non_negative_int
    from attnkit.run import load_run

    non_negative_int("--threads", args.threads, zero="the default")
    check(
        args.dtype == "float32" or args.compute_type == "float32",
        f"--dtype {args.dtype} casts the whole model and --compute-type {args.compute_type} "
        "converts its linear layers; choose one",
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    check_tokenizer = not args.ignore_tokenizer_mismatch
    overrides = model_overrides(args.set or [])
    run = load_run(
        args.run_dir,
        args.device,
        check_tokenizer=check_tokenizer,
        overrides=overrides,
        compute_type=args.compute_type,
        allow_rules=args.allow_rule or (),
    )
    if args.dtype != "float32":
        run.model.to(getattr(torch, args.dtype))
    return run


def model_overrides(items: list[str]) -> dict:
    """`--set model.KEY=VALUE` options as ModelConfig fields of the right types."""
    import typing

    from attnkit.config import ModelConfig
    from attnkit.errors import AttnkitError
    from attnkit.train.toml_values import apply_overrides, coerce

    sections = apply_overrides({}, items)
    if set(sections) - {"model"}:
        raise AttnkitError(
            f"--set on a trained model sets model settings (as model.max_len=512), not {items[0]!r}"
        )
    hints = typing.get_type_hints(ModelConfig)
    values = sections.get("model", {})
    unknown = sorted(set(values) - set(hints))
    if unknown:
        raise AttnkitError(f"model.{unknown[0]} is not a model setting")
    return {k: coerce(f"model.{k}", v, hints[k]) for k, v in values.items()}


def generation_config(args: argparse.Namespace, model):
    """GenerationConfig from the decoding options common to translate, generate and eval."""
    from attnkit.checks import check, with_article
    from attnkit.errors import AttnkitError
    from attnkit.generation import GenerationConfig

    most = args.max_new_tokens  # None: as many as max_len allows; 0 is refused like -5
    if most is not None and most > MAX_NEW_TOKENS:
        raise AttnkitError(
            f"--max-new-tokens {most:,} is more than the {MAX_NEW_TOKENS:,} one command decodes; "
            "give fewer"
        )
    options = {
        "max_new_tokens": model.config.max_len - 1 if most is None else most,
        "num_beams": getattr(args, "beam", 1),
        "length_penalty": getattr(args, "length_penalty", 1.0),
        "no_repeat_ngram_size": args.no_repeat_ngram_size,
        "repetition_penalty": args.repetition_penalty,
        "cache_implementation": args.cache_implementation,
    }
    window = getattr(args, "monotonic_window", None)
    if window is not None:
        check(
            model.config.shape == "encoder-decoder",
            "--monotonic-window keeps cross-attention near a focus moving along the source, "
            f"but this run is {with_article(model.config.shape)} model, which has no source",
        )
        options["monotonic_window"] = tuple(window)
    if getattr(args, "sample", False):
        options.update(
            do_sample=True,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
        )
    return GenerationConfig(**options)


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (config, weights, tokenizer)")
    p.add_argument(
        "--device",
        default="cpu",
        help="a torch device: cpu, cuda, cuda:N, mps, ... (default cpu); on a CUDA device "
        "decoding takes the static cache, its step replayed as a CUDA graph "
        "(--cache-implementation)",
    )
    add_compute_type_option(p)
    p.add_argument(
        "--cache-implementation",
        choices=("auto", "dynamic", "static"),  # GenerationConfig's CACHES
        default="auto",
        help="the KV cache of the running batch: auto (default: static on a CUDA device, "
        "else dynamic), dynamic (grows and drops finished rows), static (fixed memory, the "
        "step compiled by torch.compile, replayed as a CUDA graph on a GPU); the same tokens",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="the whole model's weights and activations in this type (default float32, "
        "exact); bfloat16 on a GPU halves the memory and runs on its tensor cores",
    )
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads (default 0: torch's, one per core)"
    )
    p.add_argument(
        "--max-new-tokens", type=int,
        help=f"most new tokens (default: max_len - 1; at most {MAX_NEW_TOKENS:,})",
    )  # fmt: skip
    p.add_argument(
        "--no-repeat-ngram-size",
        type=int,
        default=0,
        help="no n-gram of this many tokens appears twice in an output (default 0: off)",
    )
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="the logits of tokens already in the text divided by this (multiplied where "
        "negative), as CTRL and transformers do (default 1.0: off)",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="model.KEY=VALUE",
        help="change a setting the weights do not fix, e.g. --set model.max_len=512 "
        "--set model.rope_scaling=4 (train short, test long)",
    )
    p.add_argument(
        "--ignore-tokenizer-mismatch",
        action="store_true",
        help="a tokenizer.json whose vocabulary the run did not record is used all the same",
    )
    p.add_argument(
        "--allow-rule",
        action="append",
        metavar="MODULE:FUNCTION",
        help="import this pre-tokenization rule that the run folder names, if you trust its "
        "code (a folder's own rules are never imported unasked; attnkit's own always load)",
    )


def add_compute_type_option(p: argparse.ArgumentParser) -> None:
    from attnkit.nn.compute_type import COMPUTE_TYPES

    p.add_argument(
        "--compute-type",
        choices=COMPUTE_TYPES,
        default="float32",
        help="linear layers in float32 (default, exact), int8 or bf16 (faster; within 0.1 BLEU "
        "of float32 on Multi30k), int8-weights or fp8 (a GPU's weights in 8 bits), or auto: "
        "the fastest of them this CPU runs",
    )


def add_beam_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beam", type=int, default=1, help="beam size (default 1: greedy)")
    p.add_argument("--length-penalty", type=float, default=1.0, help="beam score / length^this")
    p.add_argument(
        "--monotonic-window",
        type=int,
        nargs=2,
        metavar=("BACK", "AHEAD"),
        help="monotonic tasks: each step attends only to source positions BACK behind to "
        "AHEAD past where the last step attended most (default: off)",
    )
    p.add_argument(
        "--batch-size", type=int, default=32, help="sentences decoded together (default 32)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
