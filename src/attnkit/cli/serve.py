"""`attnkit serve RUN [RUN ...]`: the runs behind an HTTP API (attnkit.serve), until Ctrl-C.

Each run is served under its folder's name (`runs/multi30k_de_en` as
`multi30k_de_en`); it needs the `serve` extra: `pip install -e ".[serve]"`.
"""

from __future__ import annotations

import argparse
import logging
import os

log = logging.getLogger(__name__)


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    from attnkit.cli.decoding import add_compute_type_option
    from attnkit.serve.settings import ServeSettings

    d = ServeSettings()
    p = sub.add_parser("serve", help="serve runs over HTTP: OpenAI-style completions, translate")
    p.add_argument("runs", nargs="+", help="run folders (attnkit's, or imported from HF)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads (default 0: torch's, one per core)"
    )
    add_compute_type_option(p)
    limits = {  # option: (type, default, what it does); the defaults are ServeSettings'
        "--batch-wait-ms": (float, d.batch_wait_ms, "how long a request waits for others to "
                            "share its decode"),
        "--max-batch": (int, d.max_batch, "most requests decoded together"),
        "--max-input-tokens": (int, d.max_input_tokens, "longer inputs get 400"),
        "--max-new-tokens": (int, d.max_new_tokens, "a request asking more gets 400"),
        "--max-concurrent": (int, d.max_concurrent, "requests in flight at once; more get 429"),
        "--timeout": (float, d.timeout_s, "seconds a request may take; slower ones get 504"),
        "--max-texts": (int, d.max_texts, "texts in one request"),
    }  # fmt: skip
    for option, (kind, default, text) in limits.items():
        p.add_argument(option, type=kind, default=default, help=f"{text} (default {default})")
    p.add_argument(
        "--api-key",
        default=os.environ.get("ATTNKIT_API_KEY"),
        help="require Authorization: Bearer KEY on /v1 requests (default: $ATTNKIT_API_KEY)",
    )
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ModuleNotFoundError:
        from attnkit.errors import AttnkitError

        raise AttnkitError('attnkit serve needs its extra: pip install "attnkit[serve]"') from None
    import torch

    from attnkit.serve.app import create_app
    from attnkit.serve.runs import served_runs
    from attnkit.serve.settings import ServeSettings

    if args.threads:
        torch.set_num_threads(args.threads)
    settings = ServeSettings(
        batch_wait_ms=args.batch_wait_ms, max_batch=args.max_batch,
        max_input_tokens=args.max_input_tokens, max_new_tokens=args.max_new_tokens,
        max_concurrent=args.max_concurrent, timeout_s=args.timeout, api_key=args.api_key,
        max_texts=args.max_texts,
    )  # fmt: skip
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        log.warning("listening on %s with no API key: anyone who reaches it may use it", args.host)
    app = create_app(served_runs(args.runs, args.compute_type), settings)
    print(f"serving {', '.join(args.runs)} on http://{args.host}:{args.port} (Ctrl-C stops)")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
