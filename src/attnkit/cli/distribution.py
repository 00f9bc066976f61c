"""`attnkit distribution`: a run's output distribution against the one-hot target, before and
after training, for one sentence.

    attnkit distribution RUN TEXT PNG [--source SOURCE] [--seed 0] [--top 10]

RUN is a trained run folder; "before" is the same model freshly initialised (its weights
drawn from --seed, as training starts), "after" the run's weights. A language model predicts
each token of TEXT from those before it; a translation model reads --source and predicts
TEXT. The picture draws each position's distribution (`attnkit.viz.plot_output_distribution`)
and the table prints p(target) and -log p(target) of each position on both sides, the numbers
the picture draws (`attnkit.output_distribution`).
"""

from __future__ import annotations

import argparse


def add_distribution_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "distribution",
        help="draw a run's output distribution against the one-hot target, before and after",
    )
    p.add_argument("run", help="a trained run folder (a language or translation model)")
    p.add_argument("text", help="the sentence whose tokens are predicted")
    p.add_argument("png", help="the picture to write")
    p.add_argument("--source", help="a translation model's source sentence")
    p.add_argument("--seed", type=int, default=0, help="draws the untrained weights (default 0)")
    p.add_argument(
        "--top", type=int, default=10, help="bars a panel: the target and the most likely others"
    )
    p.set_defaults(func=cmd_distribution)


def cmd_distribution(args: argparse.Namespace) -> int:
    import torch

    from attnkit.errors import AttnkitError
    from attnkit.models import build_model
    from attnkit.output_distribution import plot_output_distribution, target_distributions
    from attnkit.run import RunFolder, load_run
    from attnkit.viz import check_picture

    if args.top < 1:
        raise AttnkitError(f"--top is the bars a panel draws, 1 or more, not {args.top}")
    check_picture(args.png, "PNG", RunFolder(args.run).inputs())
    run = load_run(args.run)
    torch.manual_seed(args.seed)
    untrained = build_model(run.model.config)
    before = target_distributions(untrained, run.tokenizer, args.text, args.source)
    after = target_distributions(run.model, run.tokenizer, args.text, args.source)
    print(f"{'position':>8}  {'target':<10} {'p before':>9} {'p after':>9} {'-log p before':>14} "
          f"{'-log p after':>13}")  # fmt: skip
    for t, token in enumerate(after.tokens):
        print(
            f"{t:>8}  {token!r:<10} {float(before.target_probs[t]):>9.4f} "
            f"{float(after.target_probs[t]):>9.4f} {float(before.losses[t]):>14.4f} "
            f"{float(after.losses[t]):>13.4f}"
        )
    print(
        f"{'mean':>8}  {'':<10} {'':>9} {'':>9} {float(before.losses.mean()):>14.4f} "
        f"{float(after.losses.mean()):>13.4f}"
    )
    sides = [("before", before.probs), ("after", after.probs)]
    path = plot_output_distribution(sides, after.targets, after.tokens, args.png, top=args.top)
    print(f"wrote {path}")
    return 0
