"""`attnkit import hf` and `attnkit export hf | onnx`: run folders to and from other formats."""

from __future__ import annotations

import argparse


def cmd_import_hf(args: argparse.Namespace) -> int:
    """Turn a Hugging Face folder, or a Hub id's snapshot, into an attnkit run folder."""
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


def add_interop_parsers(sub: argparse._SubParsersAction) -> None:
    from attnkit.interop import FAMILIES

    about = {
        "hf": "a Hugging Face folder (config.json, model.safetensors) of a model_type attnkit "
        f"maps: {', '.join(FAMILIES)}",
        "onnx": "ONNX graphs for ONNX Runtime (model.onnx, or encoder.onnx and decoder.onnx)",
    }
    run, out = ("run_dir", "attnkit run folder"), {k: ("out_dir", v) for k, v in about.items()}
    source = (
        "src_dir",
        f"{about['hf']}, or a model's Hub id (ORG/NAME), read from the huggingface_hub cache "
        "and downloaded into it when missing (not with HF_HUB_OFFLINE=1)",
    )
    families = ", ".join(FAMILIES)
    for name, func, formats, text in (
        ("import", cmd_import_hf, {"hf": (source, run)},
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
