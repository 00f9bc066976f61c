"""The Trainer's overhead: the demo task trained by the Trainer and by a bare loop.

    python -m bench trainer --steps 150 --threads 1 --reps 3

Both sides train the same model on the same pre-made batches with the same
AdamW settings and clipping; the peer is the demo's loop before the Trainer
(forward, cross-entropy, backward, clip, AdamW step, LambdaLR). The Trainer
side also pays for what the bare loop lacks: token-count normalisation, the
NaN check, logging, the final checkpoint and the curves picture. Reported:
steps per second of each side, run alternately (bench.harness), and the ratio.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnkit import demo
from attnkit.models import EncoderDecoder
from attnkit.train import Trainer
from attnkit.train.tasks import build_task
from bench.harness import Result, alternate, finish, opening


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench trainer", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    header = opening(f"{args.threads} threads, {args.reps} reps")
    base = {"train.steps": args.steps, "train.save_every": args.steps, "train.threads": 0}
    config = demo.demo_run_config(**base, **{"eval.every": 10 * args.steps})
    setup = build_task(config)
    batches = [b for _, b in zip(range(args.steps), setup.train_data, strict=False)]
    c = config.train
    tmp = tempfile.TemporaryDirectory()
    runs = iter(range(1_000_000))

    def trainer() -> float:
        torch.manual_seed(c.seed)
        model = EncoderDecoder(setup.model.config)
        run_dir = f"{tmp.name}/run{next(runs)}"
        start = time.perf_counter()
        Trainer(model, batches, train=c, eval=config.eval, run_dir=run_dir).fit()
        return args.steps / (time.perf_counter() - start)

    def bare_loop() -> float:
        torch.manual_seed(c.seed)
        model = EncoderDecoder(setup.model.config)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=c.lr, betas=(c.beta1, c.beta2), eps=c.eps, weight_decay=0.0
        )
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda s: min((s + 1) / c.warmup, max(0.0, (c.steps - s) / (c.steps - c.warmup))),
        )
        model.train()
        start = time.perf_counter()
        for b in batches:
            logits = model(b.src, b.tgt[:, :-1], b.src_mask, b.tgt_mask[:, :-1]).logits
            loss = F.cross_entropy(logits.flatten(0, 1), b.tgt[:, 1:].flatten(), ignore_index=0)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), c.clip_norm)
            optimizer.step()
            schedule.step()
            loss.item()  # the demo's progress bar read the loss every step
        return args.steps / (time.perf_counter() - start)

    ours, peer = alternate(trainer, bare_loop, reps=args.reps)
    tmp.cleanup()
    result = Result(
        f"demo task, {args.steps} steps, {args.threads} thread(s)",
        "steps/s",
        ours,
        peer,
        "bare training loop",
    )
    finish([result], header, args.out)


if __name__ == "__main__":
    main()
