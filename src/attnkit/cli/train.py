"""`attnkit demo | train`: a model trained, with a progress bar fed by the Trainer.

Bad input arrives as an `AttnkitError`, which `attnkit.cli.main` prints as its one sentence.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
from pathlib import Path


class _Progress:
    """A tqdm bar fed by the Trainer's per-step callback: loss, learning rate, tokens/s, ETA."""

    def __init__(self, total: int, desc: str) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)
        self.tokens, self.last = 0.0, time.perf_counter()

    def __call__(self, info: dict) -> None:
        if info.get("total", self.bar.total) != self.bar.total:  # known once the data is read
            self.bar.total = info["total"]
        if self.bar.n == 0 and info["step"] > 1:
            self.bar.update(info["step"] - 1)  # a resumed run starts part-way
        self.bar.update(1)
        self.tokens += info["tokens"]
        if info["step"] % 10 == 0:
            now = time.perf_counter()
            rate = self.tokens / max(now - self.last, 1e-9)
            self.bar.set_postfix(
                loss=f"{info['loss']:.4f}", lr=f"{info['lr']:.2e}", tok_s=f"{rate:.0f}"
            )
            self.tokens, self.last = 0.0, now

    def redirect_logging(self) -> contextlib.AbstractContextManager:
        """Log lines printed above the bar instead of through it."""
        from tqdm.contrib.logging import logging_redirect_tqdm

        return logging_redirect_tqdm()

    def close(self) -> None:
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
    if not args.verbose:
        logging.getLogger("attnkit.train").setLevel(logging.WARNING)  # the bar says enough
    progress = _Progress(args.steps, "training")
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
            result = train(config, resume=args.resume, callbacks=callbacks, resume_command=command)
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


def add_train_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train a small model on a built-in task in about a minute")
    p.add_argument("--steps", type=int, default=1500, help="training steps (default 1500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-examples", type=int, default=1000, help="held-out strings to score")
    p.add_argument("--out", default="attnkit-demo", help="folder for the heat map")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: 1)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("train", help="train a model from a run config (TOML)")
    p.add_argument("config", help="run config, e.g. configs/multi30k_de_en.toml")
    p.add_argument(
        "--set",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="override one config key (repeatable), e.g. --set train.lr=5e-4",
    )
    p.add_argument("--resume", action="store_true", help="continue the run in train.out_dir")
    p.set_defaults(func=cmd_train)
