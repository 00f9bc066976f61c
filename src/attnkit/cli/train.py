"""`attnkit demo | train | recipes`: a model trained (with a progress bar), the recipes listed.

Bad input arrives as an `AttnkitError`, which `attnkit.cli.main` prints as its one sentence.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from pathlib import Path


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


def cmd_recipes(args: argparse.Namespace) -> int:
    """List the packaged recipes, one line each: the name `attnkit train` takes, what it trains."""
    from attnkit import recipes

    names = recipes.names()
    width = max(map(len, names))
    for name in names:
        print(f"{name:<{width}}  {recipes.summary(name)}")
    print(f"\nrun one: attnkit train NAME (or a path to a TOML file); the files: {recipes.FOLDER}")
    return 0


def add_train_parsers(sub: argparse._SubParsersAction) -> None:
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
