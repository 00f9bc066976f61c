"""The Trainer's overhead: the demo task trained by the Trainer and by a bare loop, side by side.

    PYTHONPATH=src python bench/bench_trainer.py --steps 200 --threads 1 --reps 3

Both train the same model on the same batches with the same optimizer and
schedule; the bare loop is the demo's loop before the Trainer (forward,
cross-entropy, backward, clip, AdamW, LambdaLR). Reported: steps per second
of each, best of `reps`, and their ratio.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import torch.nn.functional as F

from attnkit import demo
from attnkit.models import EncoderDecoder
from attnkit.train import Trainer


def bare_loop(config, batches) -> float:
    torch.manual_seed(config.train.seed)
    model = EncoderDecoder(demo.demo_config())
    c = config.train
    optimizer = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=0.0, eps=c.eps)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / c.warmup, max(0.0, (c.steps - s) / (c.steps - c.warmup)))
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
        loss.item()  # as the demo's progress bar read it
    return time.perf_counter() - start


def trainer_loop(config, batches) -> float:
    torch.manual_seed(config.train.seed)
    model = EncoderDecoder(demo.demo_config())
    trainer = Trainer(model, batches, train=config.train, eval=config.eval)
    start = time.perf_counter()
    trainer.fit()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        config = demo.demo_run_config(
            **{"train.steps": args.steps, "train.save_every": args.steps, "train.threads": 0}
        )
        setup = demo.reverse_setup(config)
        batches = [b for _, b in zip(range(args.steps), setup.train_data, strict=False)]
        best = {"bare loop": float("inf"), "Trainer": float("inf")}
        for rep in range(args.reps):
            run = demo.demo_run_config(
                **{
                    "train.steps": args.steps,
                    "train.save_every": args.steps,
                    "train.out_dir": f"{tmp}/run{rep}",
                    "eval.every": 10 * args.steps,
                }
            )
            best["bare loop"] = min(best["bare loop"], bare_loop(run, batches))
            best["Trainer"] = min(best["Trainer"], trainer_loop(run, batches))
    print(f"demo task, {args.steps} steps, {args.threads} thread(s), best of {args.reps}")
    for name, seconds in best.items():
        print(f"{name:>10}: {args.steps / seconds:7.1f} steps/s")
    print(f"Trainer / bare loop time: {best['Trainer'] / best['bare loop']:.2f}")


if __name__ == "__main__":
    main()
