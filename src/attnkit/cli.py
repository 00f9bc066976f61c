"""The command line: `attnkit demo | train | ...`.

Only wiring lives here: each command parses its options, calls the library,
and shows progress and results. Bad input from anywhere below arrives as an
`AttnkitError` and is printed as its one sentence, without a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from pathlib import Path

from attnkit.errors import AttnkitError

log = logging.getLogger("attnkit")


class _Progress:
    """A tqdm bar fed by the Trainer's per-step callback: loss, learning rate, tokens/s, ETA."""

    def __init__(self, total: int, desc: str) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)
        self.tokens, self.last = 0.0, time.perf_counter()

    def __call__(self, info: dict) -> None:
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
    import shutil

    import torch

    from attnkit import demo
    from attnkit.train.checkpoint import STATE_FILE

    if args.threads:
        torch.set_num_threads(args.threads)
    c = demo.demo_config()
    print(
        f"attnkit demo: teach a {c.n_encoder_layers}+{c.n_decoder_layers}-layer Transformer "
        f"(d_model {c.d_model}) to reverse digit strings"
    )
    out = Path(args.out)
    run_dir = out / "run"
    if (run_dir / STATE_FILE).exists():  # the demo starts afresh each time
        shutil.rmtree(run_dir)
    config = demo.demo_run_config(
        **{"train.steps": args.steps, "train.seed": args.seed, "train.out_dir": str(run_dir)}
    )
    if not args.verbose:
        logging.getLogger("attnkit.train").setLevel(logging.WARNING)  # the bar says enough
    start = time.perf_counter()
    progress = _Progress(args.steps, "training")
    try:
        with progress.redirect_logging():
            model = demo.train_reverser(config, callbacks=[progress]).model
    finally:
        progress.close()
    train_time = time.perf_counter() - start
    task = demo.ReverseTask(max_len=config.data.max_len)
    accuracy, results = demo.exact_match(model, task, args.eval_examples, seed=args.seed + 1)
    print(f"\n{'source':>14}  {'expected':>14}  {'model':>14}")
    for src, tgt, hyp in results[:8]:
        mark = "ok" if tgt == hyp else "WRONG"
        print(f"{demo.show(src):>14}  {demo.show(tgt):>14}  {demo.show(hyp):>14}  {mark}")
    print(
        f"\nexact match on {args.eval_examples} held-out strings: {accuracy:.1%} "
        f"(trained {args.steps} steps in {train_time:.0f} s)"
    )
    picture = demo.attention_picture(model, results[0][0], out / "attention.png")
    print(f"cross-attention heat map: {picture}")
    print(f"run folder (model, metrics, curves): {run_dir}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train the model a run config describes; the run folder is its train.out_dir."""
    from attnkit.train import Trainer
    from attnkit.train import distributed as dist
    from attnkit.train.run_config import RunConfig
    from attnkit.train.tasks import build_task

    config = RunConfig.load(args.config, args.set or [])
    info = dist.from_env()
    if not info.is_main:
        logging.getLogger().setLevel(logging.WARNING)  # only rank 0 talks
    setup = build_task(config)
    progress = _Progress(config.train.steps, "training") if info.is_main else None
    trainer = Trainer(
        setup.model,
        setup.train_data,
        train=config.train,
        eval=config.eval,
        val_data=setup.val_data,
        metrics=setup.metrics,
        tokenizer=setup.tokenizer,
        run_config=config,
        callbacks=[progress] if progress else [],
    )
    try:
        with progress.redirect_logging() if progress else contextlib.nullcontext():
            result = trainer.fit(resume=args.resume)
    finally:
        if progress:
            progress.close()
        dist.teardown()
    if not info.is_main:
        return 0
    if result.stopped == "interrupted":
        print(
            f"stopped at step {result.step} and saved; continue with: "
            f"attnkit train {args.config} --resume"
        )
        return 130
    best = f", best {config.eval.metric} {result.best:.4g}" if result.best is not None else ""
    print(f"{result.stopped} at step {result.step}{best}; run folder: {result.run_dir}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="train a small model on a built-in task in about a minute")
    p.add_argument("--steps", type=int, default=1500, help="training steps (default 1500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-examples", type=int, default=1000, help="held-out strings to score")
    p.add_argument("--out", default="attnkit-demo", help="folder for the heat map")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.func(args)
    except AttnkitError as err:
        print(f"attnkit: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
