"""The command line: `attnkit demo | ...`.

Only wiring lives here: each command parses its options, calls the library,
and shows progress and results. Bad input from anywhere below arrives as an
`AttnkitError` and is printed as its one sentence, without a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from attnkit.errors import AttnkitError

log = logging.getLogger("attnkit")


def cmd_demo(args: argparse.Namespace) -> int:
    """Train the digit-reversal model, print held-out examples, draw its attention."""
    import torch
    from tqdm import tqdm

    from attnkit import demo

    if args.threads:
        torch.set_num_threads(args.threads)
    c = demo.demo_config()
    print(
        f"attnkit demo: teach a {c.n_encoder_layers}+{c.n_decoder_layers}-layer Transformer "
        f"(d_model {c.d_model}) to reverse digit strings"
    )
    start = time.perf_counter()
    with tqdm(total=args.steps, desc="training", unit="step", dynamic_ncols=True) as bar:

        def on_step(step: int, loss: float) -> None:
            bar.update(1)
            if step % 10 == 0:
                bar.set_postfix(loss=f"{loss:.4f}")

        model = demo.train_reverser(steps=args.steps, seed=args.seed, on_step=on_step)
    train_time = time.perf_counter() - start
    task = demo.ReverseTask()
    accuracy, results = demo.exact_match(model, task, args.eval_examples, seed=args.seed + 1)
    print(f"\n{'source':>14}  {'expected':>14}  {'model':>14}")
    for src, tgt, hyp in results[:8]:
        mark = "ok" if tgt == hyp else "WRONG"
        print(f"{demo.show(src):>14}  {demo.show(tgt):>14}  {demo.show(hyp):>14}  {mark}")
    print(
        f"\nexact match on {args.eval_examples} held-out strings: {accuracy:.1%} "
        f"(trained {args.steps} steps in {train_time:.0f} s)"
    )
    out = Path(args.out)
    picture = demo.attention_picture(model, results[0][0], out / "attention.png")
    print(f"cross-attention heat map: {picture}")
    return 0


def cmd_import_hf(args: argparse.Namespace) -> int:
    """Turn a Hugging Face folder into an attnkit run folder."""
    from attnkit.interop import import_hf

    imported = import_hf(args.src_dir, args.run_dir)
    c = imported.model.config
    print(
        f"imported {imported.model_type} as an attnkit {c.shape} model "
        f"({imported.model.num_parameters():,} parameters) into {args.run_dir}"
    )
    if imported.tokenizer is not None:
        print(f"copied {imported.tokenizer.name}")
    if imported.unused:
        print(f"not used by attnkit ({len(imported.unused)} tensors): {', '.join(imported.unused)}")
    return 0


def cmd_export_hf(args: argparse.Namespace) -> int:
    """Turn an attnkit run folder into a Hugging Face folder."""
    from attnkit.interop import export_hf

    out = export_hf(args.run_dir, args.out_dir)
    print(f"exported {args.run_dir} to {out} (config.json, model.safetensors)")
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

    hf_folder = "a Hugging Face folder (config.json, model.safetensors): gpt2, bert or marian"
    for name, func, folders in (
        ("import", cmd_import_hf, (("src_dir", hf_folder), ("run_dir", "attnkit run folder"))),
        ("export", cmd_export_hf, (("run_dir", "attnkit run folder"), ("out_dir", hf_folder))),
    ):
        p = sub.add_parser(name, help=f"{name} a model as a Hugging Face folder: {name} hf ...")
        formats = p.add_subparsers(dest="format", required=True, metavar="FORMAT")
        q = formats.add_parser("hf", help=hf_folder)
        for folder, text in folders:
            q.add_argument(folder, help=text)
        q.set_defaults(func=func)
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
