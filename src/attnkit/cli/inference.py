"""`attnkit translate | generate | eval`: a trained run put to use, on lines, a prompt or a
corpus split.

Each command loads the run (`attnkit.cli.decoding`: the run's options and the decoding
flags), calls the library and prints its text or scores; a run reads its input as it
learned to (`attnkit.inference.translate_run`, `attnkit.evaluation.run`).
"""

from __future__ import annotations

import argparse
import sys

from attnkit.cli.decoding import (
    add_beam_options,
    add_run_options,
    generation_config,
    load_run_of,
)


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="line",
        # Off a terminal (a log file, a pipe) a bar is carriage returns in one long line,
        # as for `attnkit train`: draw it only where a person watches.
        disable=not enabled or total < 64 or not sys.stderr.isatty(),
        dynamic_ncols=True,
        file=sys.stderr,
    )


def cmd_translate(args: argparse.Namespace) -> int:
    """Translate lines from --input (or stdin), one output line per input line, in order."""
    from attnkit.data.section import prepare_sources
    from attnkit.files import check_writable
    from attnkit.inference import read_texts, translate_n_best, translate_run, write_lines
    from attnkit.run import RunFolder

    inputs = [("--input", args.input), *RunFolder(args.run_dir).inputs()]
    if args.output:  # before any work, which would be lost; never over what it reads
        check_writable(args.output, "--output", inputs=inputs, stdin=args.input is None)
    if args.attention_plot:
        from attnkit.viz import check_picture

        check_picture(args.attention_plot, "--attention-plot", inputs)
    if args.n_best is not None:
        _check_n_best(args.n_best, args.beam)
    lines = read_texts(args.input)
    run = load_run_of(args)
    model, tokenizer = run.model, run.tokenizer
    config = generation_config(args, model)
    options = {"batch_size": args.batch_size, "refuse_long": args.refuse_long}
    with _progress(len(lines), "translating", not args.no_progress) as bar:
        if args.n_best is None:
            outputs = translate_run(run, lines, config, **options, progress=bar.update)
            write_lines(outputs, args.output)
        else:
            sources = prepare_sources(run.data, lines)  # as translate_run reads them
            best = translate_n_best(
                model, tokenizer, sources, args.n_best, config, **options, progress=bar.update
            )
            outputs = [hypotheses[0].text for hypotheses in best]
            # Moses' n-best format: the input's line number from 0, the text, its score (an
            # empty line is not decoded: its empty translations have none, and show nan).
            n_best = [
                f"{i} ||| {h.text} ||| {float('nan') if h.score is None else h.score:.4f}"
                for i, hs in enumerate(best)
                for h in hs
            ]
            write_lines(n_best, args.output)
    if args.attention_plot and lines:
        from attnkit.generation.config import resolve
        from attnkit.viz import plot_model_attention

        (source,) = prepare_sources(run.data, lines[:1])  # what the model read
        src = tokenizer.encode(source, add_eos=True)[: model.config.max_len]
        start = resolve(config, {}, model.config, tokenizer).decoder_start_token_id
        tgt = [start, *tokenizer.encode(outputs[0])][: model.config.max_len]  # what it read
        picture = plot_model_attention(
            model, src, args.attention_plot, kind=args.attention_kind, tgt=tgt,
            token=lambda i: tokenizer.id_to_token(i) or "?",
        )  # fmt: skip
        print(f"{args.attention_kind} attention of the first input: {picture}", file=sys.stderr)
    return 0


def _check_n_best(n: int, beam: int) -> None:
    from attnkit.errors import AttnkitError

    if n < 1:
        raise AttnkitError(f"--n-best must be at least 1, got {n}")
    if beam < max(n, 2):
        raise AttnkitError(
            f"--n-best {n} lists beam search's best translations with their scores, but "
            f"--beam is {beam}; give --beam {max(n, 2)} or more"
        )


def cmd_generate(args: argparse.Namespace) -> int:
    """Continue --prompt with a language model, streaming the text as it is produced; many
    prompts (--prompt again, --input) decode together, each output on its own line."""
    from attnkit.checks import positive_int
    from attnkit.errors import AttnkitError
    from attnkit.inference import complete, complete_all, read_texts
    from attnkit.run import RunFolder

    if args.attention_plot:  # before any work
        from attnkit.viz import check_picture

        check_picture(args.attention_plot, "--attention-plot", RunFolder(args.run_dir).inputs())
    prompts = [*(args.prompt or []), *(read_texts(args.input) if args.input else [])]
    if not prompts:
        raise AttnkitError("give a prompt: --prompt TEXT (again for more), or --input FILE")
    positive_int("--batch-size", args.batch_size)
    run = load_run_of(args)
    config = generation_config(args, run.model)
    if len(prompts) == 1:
        (prompt,) = prompts
        pieces = complete(run.model, run.tokenizer, prompt, config)  # checked before output
        sys.stdout.write(prompt)
        sys.stdout.flush()
        text = prompt
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
            text += piece
        sys.stdout.write("\n")
    else:  # rows of one running batch (the engine the server runs), in order
        outputs = complete_all(
            run.model, run.tokenizer, prompts, config, batch_size=args.batch_size
        )
        texts = [prompt + output for prompt, output in zip(prompts, outputs, strict=True)]
        sys.stdout.write("".join(f"{text}\n" for text in texts))
        text = texts[0]
    if args.attention_plot:
        from attnkit.viz import plot_model_attention

        tokenizer = run.tokenizer
        ids = tokenizer.encode(text)[-run.model.config.max_len :]
        picture = plot_model_attention(
            run.model, ids, args.attention_plot, kind="decoder",
            token=lambda i: tokenizer.id_to_token(i) or "?",
        )  # fmt: skip
        label = "first prompt" if len(prompts) > 1 else "prompt"
        print(f"self-attention of the {label} and its continuation: {picture}", file=sys.stderr)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Score a run on a corpus split: BLEU and chrF for translation, WER and PER for G2P,
    perplexity for a LM."""
    from attnkit.evaluation.run import read_eval_set, score_run
    from attnkit.files import check_writable
    from attnkit.inference import write_lines
    from attnkit.run import RunFolder

    if args.output:
        check_writable(args.output, "--output", inputs=RunFolder(args.run_dir).inputs())
    run = load_run_of(args)
    data = read_eval_set(
        run,
        corpus=args.corpus,
        split=args.split,
        src_lang=args.src_lang,
        tgt_lang=args.tgt_lang,
        data_dir=args.data_dir,
        limit=args.limit,
        block_size=args.block_size,
        batch_size=args.batch_size,
    )
    if args.output:  # the corpus files the run's data section resolved to are inputs too
        check_writable(args.output, "--output", inputs=data.inputs)
    config = generation_config(args, run.model)
    with _progress(len(data.sources), "translating", not args.no_progress) as bar:
        result = score_run(run, data, config, batch_size=args.batch_size, progress=bar.update)
    if args.output and result.hypotheses:
        write_lines(result.hypotheses, args.output)
    kind = "" if run.compute_type == "float32" else f", linear layers in {run.compute_type}"
    print(f"attnkit eval {args.run_dir}: {result.description}{kind}")
    print(result.table())
    return 0


def add_inference_parsers(sub: argparse._SubParsersAction) -> None:
    from attnkit.data import CORPORA

    p = sub.add_parser("translate", help="translate lines with an encoder-decoder run")
    add_run_options(p)
    add_beam_options(p)
    p.add_argument("--input", help="a text file, one sentence a line (default: stdin)")
    p.add_argument("--output", help="write the translations here (default: stdout)")
    p.add_argument(
        "--refuse-long", action="store_true", help="stop on inputs over max_len, not cut them"
    )
    p.add_argument(
        "--n-best",
        type=int,
        metavar="K",
        help="print the K best translations of each line (needs --beam K or more), one a line "
        "as `LINE ||| TEXT ||| SCORE`: the input's line from 0, the beam's length-penalised "
        "log-probability (default: the best alone, without its score)",
    )
    p.add_argument("--attention-plot", metavar="PNG", help="draw the first input's attention")
    p.add_argument(
        "--attention-kind",
        choices=("cross", "encoder", "decoder"),
        default="cross",
        help="which attention --attention-plot draws (default cross)",
    )
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("generate", help="continue a prompt with a language-model run, streaming")
    add_run_options(p)
    p.add_argument(
        "--prompt",
        action="append",
        help="the text to continue, streamed; give it again (or --input) for more prompts, "
        "decoded together in one running batch, each output on a line of its own",
    )
    p.add_argument("--input", help="a text file of prompts, one a line, decoded together")
    p.add_argument(
        "--batch-size", type=int, default=32, help="prompts decoded together (default 32)"
    )
    p.add_argument("--greedy", dest="sample", action="store_false", help="argmax, not sampling")
    p.add_argument(
        "--temperature", type=float, default=1.0, help="logits divided by this (default 1.0)"
    )
    p.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    p.add_argument("--seed", type=int, default=None, help="makes sampling reproducible (default: "
                   "none, a new draw each time)")  # fmt: skip
    p.add_argument("--attention-plot", metavar="PNG", help="draw the self-attention of the text")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser(
        "eval", help="BLEU/chrF (translation), WER/PER (cmudict) or perplexity (language model)"
    )
    add_run_options(p)
    add_beam_options(p)
    p.add_argument("--split", help="corpus split (default: test, or val where there is no test)")
    p.add_argument(
        "--corpus",
        help=f"{', '.join(CORPORA)} or a path (default: the run's, else by the model's shape)",
    )
    p.add_argument("--src-lang", help="source language (default: the run's, else de)")
    p.add_argument("--tgt-lang", help="target language (default: the run's, else en)")
    p.add_argument("--data-dir", help="folder holding <corpus>/<files> (see attnkit.data)")
    p.add_argument(
        "--limit",
        type=int,
        default=0,
        help="score only the first N sentences/blocks (default 0: all)",
    )
    p.add_argument(
        "--block-size", type=int, default=256, help="language-model context per block (default 256)"
    )
    p.add_argument("--output", help="also write the translations here")
    p.set_defaults(func=cmd_eval)
