"""The command line: `attnkit COMMAND ...`, every command named in `attnkit --help`.

Only wiring lives here: each command parses its options, calls the library,
and shows progress and results. Bad input from anywhere below arrives as an
`AttnkitError` and is printed as its one sentence, without a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import platform
import sys
from pathlib import Path
from typing import NoReturn

from attnkit.cli.decoding import (
    add_beam_options,
    add_run_options,
    generation_config,
    load_run_of,
)
from attnkit.cli.embed import add_embed_parser
from attnkit.cli.serve import add_serve_parser
from attnkit.errors import AttnkitError

log = logging.getLogger("attnkit")


class _Progress:
    """A tqdm bar fed by the Trainer's per-step callback: steps and ETA every step; loss,
    learning rate and tokens/s on the steps that log them (`train.log_every`: reading the
    loss off a GPU waits for it, so the Trainer does it only then).

    Only on a terminal: in a log file, a pipe or CI a bar's carriage returns pile up into one
    endless line, so there the progress is the training's own log line, one every
    `train.log_every` steps and one at the last step.
    """

    def __init__(self, total: int, desc: str) -> None:
        from tqdm import tqdm

        self.bar = None
        if sys.stderr.isatty():
            self.bar = tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)

    def __call__(self, info: dict) -> None:
        if self.bar is None:
            return
        if info.get("total", self.bar.total) != self.bar.total:  # known once the data is read
            self.bar.total = info["total"]
        if self.bar.n == 0 and info["step"] > 1:
            self.bar.update(info["step"] - 1)  # a resumed run starts part-way
        self.bar.update(1)
        if info.get("loss") is not None:
            rate = f"{info['tokens_per_s']:.0f}"
            self.bar.set_postfix(loss=f"{info['loss']:.4f}", lr=f"{info['lr']:.2e}", tok_s=rate)

    def redirect_logging(self) -> contextlib.AbstractContextManager:
        """Log lines printed above the bar instead of through it."""
        if self.bar is None:
            return contextlib.nullcontext()
        from tqdm.contrib.logging import logging_redirect_tqdm

        return logging_redirect_tqdm()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_demo(args: argparse.Namespace) -> int:
    """Train the digit-reversal model, print held-out examples, draw its attention."""
    from attnkit import demo

    out = Path(args.out)
    overrides = {
        "train.steps": args.steps,
        "train.seed": args.seed,
        "train.out_dir": str(out / "run"),
    }
    if args.threads:
        overrides["train.threads"] = args.threads
    config = demo.demo_run_config(**overrides)
    c = config.model.build()
    print(
        f"attnkit demo: teach a {c.n_encoder_layers}+{c.n_decoder_layers}-layer Transformer "
        f"(d_model {c.d_model}) to reverse digit strings"
    )
    progress = _Progress(args.steps, "training")
    if not args.verbose and progress.bar is not None:
        logging.getLogger("attnkit.train").setLevel(logging.WARNING)  # the bar says enough
    try:
        with progress.redirect_logging():
            report = demo.run_demo(
                config, out / "attention.png", args.eval_examples, callbacks=[progress]
            )
    finally:
        progress.close()
    print(f"\n{'source':>14}  {'expected':>14}  {'model':>14}")
    for src, tgt, hyp in report.examples[:8]:
        print(f"{src:>14}  {tgt:>14}  {hyp:>14}  {'ok' if tgt == hyp else 'WRONG'}")
    print(
        f"\nexact match on {args.eval_examples} held-out strings: {report.accuracy:.1%} "
        f"(trained {args.steps} steps in {report.train_seconds:.0f} s)"
    )
    print(f"cross-attention heat map: {report.picture}")
    print(f"run folder (model, metrics, curves): {report.run_dir}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train the model a run config describes; the run folder is its train.out_dir."""
    from attnkit.train import distributed as dist
    from attnkit.train.run_config import RunConfig
    from attnkit.train.stopping import EXIT_STATUS, resume_command
    from attnkit.train.tasks import train
    from attnkit.train.validate import validate

    config = RunConfig.load(args.config, args.set or [])
    command = resume_command(args.config, args.set or [])  # the options it was started with
    validate(config)  # before the progress bar is drawn, so a mistake prints only its sentence
    info = dist.from_env()
    if not info.is_main:
        logging.getLogger().setLevel(logging.WARNING)  # only rank 0 talks
    progress = _Progress(config.train.steps, "training") if info.is_main else None
    callbacks = [progress] if progress else []
    try:
        with progress.redirect_logging() if progress else contextlib.nullcontext():
            result = train(
                config,
                resume=args.resume,
                overwrite=args.overwrite,
                callbacks=callbacks,
                resume_command=command,
            )
    finally:
        if progress:
            progress.close()
        dist.teardown()
    if not info.is_main:
        return 0
    if result.stopped in EXIT_STATUS:  # by Ctrl-C (130) or SIGTERM (143)
        print(f"stopped at step {result.step} and saved; continue with: {command}")
        return EXIT_STATUS[result.stopped]
    best = f", best {config.eval.metric} {result.best:.4g}" if result.best is not None else ""
    print(f"{result.stopped} at step {result.step}{best}; run folder: {result.run_dir}")
    return 0


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="line",
        disable=not enabled or total < 64,
        dynamic_ncols=True,
        file=sys.stderr,
    )


def cmd_recipes(args: argparse.Namespace) -> int:
    """List the packaged recipes, one line each: the name `attnkit train` takes, what it trains."""
    from attnkit import recipes

    names = recipes.names()
    width = max(map(len, names))
    for name in names:
        print(f"{name:<{width}}  {recipes.summary(name)}")
    print(f"\nrun one: attnkit train NAME (or a path to a TOML file); the files: {recipes.FOLDER}")
    return 0


def cmd_translate(args: argparse.Namespace) -> int:
    """Translate lines from --input (or stdin), one output line per input line, in order."""
    from attnkit.files import check_writable
    from attnkit.inference import read_texts, translate, write_lines
    from attnkit.run import RunFolder

    inputs = [("--input", args.input), *RunFolder(args.run_dir).inputs()]
    if args.output:  # before any work, which would be lost; never over what it reads
        check_writable(args.output, "--output", inputs=inputs, stdin=args.input is None)
    if args.attention_plot:
        from attnkit.viz import check_picture

        check_picture(args.attention_plot, "--attention-plot", inputs)
    lines = read_texts(args.input)
    run = load_run_of(args)
    model, tokenizer = run.model, run.tokenizer
    saved = run.folder.data_defaults()
    if saved.get("lowercase"):
        lines = [line.lower() for line in lines]  # the model was trained on lowercased text
    if saved.get("corpus") == "cmudict":  # a G2P model reads words as their letters
        from attnkit.data.cmudict import graphemes

        lines = [graphemes("".join(line.lower().split())) for line in lines]
    config = generation_config(args, model)
    with _progress(len(lines), "translating", not args.no_progress) as bar:
        outputs = translate(
            model,
            tokenizer,
            lines,
            config,
            batch_size=args.batch_size,
            refuse_long=args.refuse_long,
            progress=bar.update,
        )
    write_lines(outputs, args.output)
    if args.attention_plot and lines:
        from attnkit.viz import plot_model_attention

        src = tokenizer.encode(lines[0], add_eos=True)[: model.config.max_len]
        tgt = tokenizer.encode(outputs[0], add_bos=True)[: model.config.max_len]
        picture = plot_model_attention(
            model, src, args.attention_plot, kind=args.attention_kind, tgt=tgt,
            token=lambda i: tokenizer.id_to_token(i) or "?",
        )  # fmt: skip
        print(f"{args.attention_kind} attention of the first input: {picture}", file=sys.stderr)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Continue --prompt with a language model, streaming the text as it is produced."""
    from attnkit.inference import complete
    from attnkit.run import RunFolder

    if args.attention_plot:  # before any work
        from attnkit.viz import check_picture

        check_picture(args.attention_plot, "--attention-plot", RunFolder(args.run_dir).inputs())
    run = load_run_of(args)
    config = generation_config(args, run.model)
    pieces = complete(run.model, run.tokenizer, args.prompt, config)  # checked before output
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    text = args.prompt
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
        text += piece
    sys.stdout.write("\n")
    if args.attention_plot:
        from attnkit.viz import plot_model_attention

        tokenizer = run.tokenizer
        ids = tokenizer.encode(text)[-run.model.config.max_len :]
        picture = plot_model_attention(
            run.model, ids, args.attention_plot, kind="decoder",
            token=lambda i: tokenizer.id_to_token(i) or "?",
        )  # fmt: skip
        print(f"self-attention of the prompt and its continuation: {picture}", file=sys.stderr)
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
    config = generation_config(args, run.model)
    with _progress(len(data.sources), "translating", not args.no_progress) as bar:
        result = score_run(run, data, config, batch_size=args.batch_size, progress=bar.update)
    if args.output and result.hypotheses:
        write_lines(result.hypotheses, args.output)
    kind = "" if run.compute_type == "float32" else f", linear layers in {run.compute_type}"
    print(f"attnkit eval {args.run_dir}: {result.description}{kind}")
    print(result.table())
    return 0


def cmd_import_hf(args: argparse.Namespace) -> int:
    """Turn a Hugging Face folder into an attnkit run folder."""
    from attnkit.interop import import_hf

    print(import_hf(args.src_dir, args.run_dir, overwrite=args.overwrite).report(args.run_dir))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Turn an attnkit run folder into a Hugging Face folder (hf) or ONNX graphs (onnx)."""
    if args.format == "onnx":
        from attnkit.interop.onnx_export import export_onnx as export
    else:
        from attnkit.interop import export_hf as export

    out = export(args.run_dir, args.out_dir, overwrite=args.overwrite)
    print(f"exported {args.run_dir} to {out} ({', '.join(sorted(p.name for p in out.iterdir()))})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    import torch

    from attnkit import __version__
    from attnkit.data import CORPORA
    from attnkit.interop import FAMILIES

    parser = argparse.ArgumentParser(prog="attnkit")
    versions = f"torch {torch.__version__}, Python {platform.python_version()}"
    parser.add_argument(
        "--version",
        action="version",
        version=f"attnkit {__version__} ({versions})",
        help="print attnkit's version (and torch's and Python's) and exit",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="train a small model on a built-in task in about a minute")
    p.add_argument("--steps", type=int, default=1500, help="training steps (default 1500)")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the weights, batches and strings (default 0)"
    )
    p.add_argument(
        "--eval-examples", type=int, default=1000, help="held-out strings to score (default 1000)"
    )
    p.add_argument(
        "--out", default="attnkit-demo", help="folder for the run and the heat map (default "
        "attnkit-demo)",
    )  # fmt: skip
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads (default 0: the demo recipe's 1)"
    )
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("train", help="train a model from a recipe or a run config (TOML)")
    p.add_argument(
        "config",
        metavar="RECIPE_OR_TOML",
        help="a packaged recipe's name (attnkit recipes lists them), e.g. tinyshakespeare_char, "
        "or the path of a run config",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="override one config key (repeatable), e.g. --set train.lr=5e-4",
    )
    p.add_argument("--resume", action="store_true", help="continue the run in train.out_dir")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="train.out_dir holds an earlier run or model: remove it and train a new one",
    )
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("recipes", help="list the packaged recipes that attnkit train runs by name")
    p.set_defaults(func=cmd_recipes)

    p = sub.add_parser("translate", help="translate lines with an encoder-decoder run")
    add_run_options(p)
    add_beam_options(p)
    p.add_argument("--input", help="a text file, one sentence a line (default: stdin)")
    p.add_argument("--output", help="write the translations here (default: stdout)")
    p.add_argument(
        "--refuse-long", action="store_true", help="stop on inputs over max_len, not cut them"
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
    p.add_argument("--prompt", required=True, help="the text to continue")
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

    add_embed_parser(sub)
    add_serve_parser(sub)

    about = {
        "hf": "a Hugging Face folder (config.json, model.safetensors) of a model_type attnkit "
        f"maps: {', '.join(FAMILIES)}",
        "onnx": "ONNX graphs for ONNX Runtime (model.onnx, or encoder.onnx and decoder.onnx)",
    }
    run, out = ("run_dir", "attnkit run folder"), {k: ("out_dir", v) for k, v in about.items()}
    families = ", ".join(FAMILIES)
    for name, func, formats, text in (
        ("import", cmd_import_hf, {"hf": (("src_dir", about["hf"]), run)},
         f"import hf: a Hugging Face model ({families}) as a run folder"),
        ("export", cmd_export, {"hf": (run, out["hf"]), "onnx": (run, out["onnx"])},
         f"export hf | onnx: a run folder as a Hugging Face model ({families}) or ONNX graphs"),
    ):  # fmt: skip
        p = sub.add_parser(name, help=text)
        kinds = p.add_subparsers(dest="format", required=True, metavar="FORMAT")
        for kind, folders in formats.items():
            q = kinds.add_parser(kind, help=about[kind])
            for folder, text in folders:
                q.add_argument(folder, help=text)
            q.add_argument("--overwrite", action="store_true", help="replace an earlier output")
            q.set_defaults(func=func)
    # Named from the parsers themselves, so that a new command cannot be left out.
    parser.description = (
        f"attnkit, a Transformer toolkit on PyTorch. Commands: {', '.join(sub.choices)}. "
        "attnkit COMMAND --help says more about each."
    )
    return parser


class _Closed(io.TextIOBase):
    """A standard stream the shell closed (`>&-`, `<&-`), which Python gives as None: a command
    that uses it stops in one sentence, not with an AttributeError from deep inside."""

    def __init__(self, name: str, fix: str) -> None:
        self.name, self.fix = name, fix

    def _refuse(self, *_: object) -> NoReturn:
        raise AttnkitError(f"standard {self.name} is closed; {self.fix}")

    write = read = readline = _refuse
    buffer = property(_refuse)

    def flush(self) -> None:  # Python flushes standard output at exit: nothing to do
        pass


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if sys.stdin is None:
        sys.stdin = _Closed("input", "give the text with --input FILE, or open standard input")
    if sys.stdout is None:
        sys.stdout = _Closed(
            "output",
            "redirect it to a file (> FILE, or --output FILE where the command has one) "
            "or leave it open",
        )
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, where a closed pipe can still be handled
        return code
    except BrokenPipeError:
        # The reader left (`| head`): stop quietly; stdout to devnull, so exit's flush passes.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by it
    except AttnkitError as err:
        print(f"attnkit: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnkit: interrupted", file=sys.stderr)
        return 130
    except OSError as err:  # a full disk or a refused file where no check of attnkit's looked
        if args.verbose or err.strerror is None:
            raise
        where = f" ({err.filename})" if err.filename else ""
        print(f"attnkit: error: {err.strerror}{where}; the command stopped there", file=sys.stderr)
        return 1
    except Exception as err:  # no check foresaw it: still one sentence, the traceback on ask
        if args.verbose:
            raise
        library = type(err).__module__.split(".")[0]
        print(
            f"attnkit: error: {library} failed where attnkit did not expect it ("
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no message'}); "
            "run again as attnkit --verbose ... for the traceback, and please report it",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
