"""`attnkit serve RUN [NAME=RUN ...]`: the runs behind an HTTP API (attnkit.serve), until Ctrl-C.

Each run is served under its folder's name (`runs/multi30k_de_en` as
`multi30k_de_en`), or under NAME when given as NAME=RUN_DIR; a Hub id (ORG/NAME) is
imported once into attnkit's cache (`attnkit.interop.hub_runs`); it needs the `serve`
extra: `pip install -e ".[serve]"`. The address is taken before anything is
printed, so a busy port is one sentence, not a traceback after "serving on".
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket

from attnkit.errors import AttnkitError

log = logging.getLogger(__name__)


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    from attnkit.cli.decoding import add_compute_type_option
    from attnkit.serve.settings import ServeSettings

    d = ServeSettings()
    p = sub.add_parser("serve", help="serve runs over HTTP: OpenAI's API, translate, a page")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="run folders (attnkit's, or imported from HF), each RUN_DIR or "
                   "NAME=RUN_DIR to serve it as NAME; a Hugging Face Hub id (ORG/NAME) where "
                   "no such folder is, imported once into attnkit's cache (hub-runs/) and "
                   "served under its NAME part")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads (default 0: torch's, one per core)"
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="where the models load and decode: cpu, cuda, cuda:N, ... (default cpu)",
    )
    p.add_argument("--dtype", choices=("float32", "bf16", "fp16"), default="float32",
                   help="the models' weights and activations: float32 (default, exact), or a "
                   "GPU's bf16 or fp16 (half the memory, faster)")  # fmt: skip
    add_compute_type_option(p)
    limits = {  # option: (type, default, what it does); the defaults are ServeSettings'
        "--batch-wait-ms": (float, d.batch_wait_ms, "how long an embedding or beam request "
                            "waits for others to share its batch"),
        "--max-batch": (int, d.max_batch, "rows decoded together at most (1: one at a time)"),
        "--max-input-tokens": (int, d.max_input_tokens, "longer inputs get 400"),
        "--max-new-tokens": (int, d.max_new_tokens, "a request asking more gets 400"),
        "--max-concurrent": (int, d.max_concurrent, "/v1 requests in flight at once; more "
                             "get 429"),
        "--max-body-bytes": (int, d.max_body_bytes, "the largest request body; a larger one "
                             "is refused unread (413)"),
        "--timeout": (float, d.timeout_s, "seconds a request may take; slower ones get 504"),
        "--body-timeout": (float, d.body_timeout_s, "seconds a request's body may take to "
                           "arrive whole; slower ones get 408"),
        "--max-texts": (int, d.max_texts, "texts in one request"),
        "--max-request-tokens": (int, d.max_request_tokens, "new tokens one request may ask "
                                 "for in all: prompts x n (or best_of, beam) x max_tokens"),
    }  # fmt: skip
    for option, (kind, default, text) in limits.items():
        p.add_argument(option, type=kind, default=default, help=f"{text} (default {default})")
    p.add_argument("--cache-implementation", choices=("auto", "dynamic", "static"),
                   default=d.cache_implementation,
                   help="the KV cache of the running batch: auto (default: static on a CUDA "
                   "device, as paged memory with a step compiled for each batch size; else "
                   "dynamic), dynamic, or static on any device; the same tokens")  # fmt: skip
    p.add_argument("--kv-blocks", type=int, metavar="N",
                   help="where rows decode on paged memory (a GPU's default): blocks of 16 "
                   "positions in each model's pool (default: --max-batch rows of its "
                   "max_len; fewer make rows wait for blocks)")  # fmt: skip
    p.add_argument(
        "--api-key",
        default=os.environ.get("ATTNKIT_API_KEY"),
        help="require Authorization: Bearer KEY on /v1 requests (default: $ATTNKIT_API_KEY)",
    )
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let pages from ORIGIN (https://host; * lets any page) call the "
                   "API; repeat for several")  # fmt: skip
    p.add_argument("--chat-template", metavar="FILE",
                   help="a Jinja chat template (Hugging Face's) for every decoder served, over "
                   "the run's own (tokenizer_config.json's chat_template)")  # fmt: skip
    p.add_argument("--no-access-log", dest="access_log", action="store_false",
                   help="no log line per request")  # fmt: skip
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ModuleNotFoundError:
        raise AttnkitError('attnkit serve needs its extra: pip install "attnkit[serve]"') from None
    import torch

    from attnkit.devices import check_device
    from attnkit.serve.app import create_app
    from attnkit.serve.runs import served_runs
    from attnkit.serve.settings import ServeSettings

    settings = ServeSettings(
        max_batch=args.max_batch, kv_blocks=args.kv_blocks, batch_wait_ms=args.batch_wait_ms,
        cache_implementation=args.cache_implementation,
        max_input_tokens=args.max_input_tokens, max_new_tokens=args.max_new_tokens,
        max_concurrent=args.max_concurrent, max_body_bytes=args.max_body_bytes,
        timeout_s=args.timeout, api_key=args.api_key, max_texts=args.max_texts,
        max_request_tokens=args.max_request_tokens, body_timeout_s=args.body_timeout,
        cors_origins=tuple(args.cors_origin), access_log=args.access_log,
    )  # fmt: skip
    if args.threads < 0:
        raise AttnkitError(f"--threads is a count of threads (0: torch's), not {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)
    for spec in args.runs:  # a loop of links would reach the catch-all sentence when resolved
        for path in {spec, spec.partition("=")[2]} - {""}:
            if _loops(path):
                raise AttnkitError(f"{path} is a loop of symbolic links; give the run folder")
    check_device(args.device, "--device")  # a missing GPU is one sentence before anything
    template = None if args.chat_template is None else _read_template(args.chat_template)
    listening = _listen(args.host, args.port)  # before the models load: a busy port fails fast
    served = served_runs(args.runs, args.compute_type, args.device, args.dtype, template)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        log.warning("listening on %s with no API key: anyone who reaches it may use it", args.host)
    app = create_app(served, settings)
    port = listening.getsockname()[1]
    names = ", ".join(s.name for s in served)
    print(f"serving {names} on http://{args.host}:{port} (Ctrl-C stops)", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[listening])
    return 0


def _loops(path: str) -> bool:
    try:
        os.stat(path)
    except OSError as err:
        return err.errno == errno.ELOOP
    return False


def _read_template(path: str) -> str:
    """The text of --chat-template FILE, or one sentence saying why it cannot be read."""
    from pathlib import Path

    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AttnkitError(f"--chat-template {path}: no such file") from None
    except UnicodeDecodeError:
        raise AttnkitError(f"--chat-template {path} is not UTF-8 text") from None
    except OSError as err:
        raise AttnkitError(f"--chat-template {path} cannot be read: {err.strerror}") from None


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, or one sentence saying why it cannot be."""
    if not 0 <= port <= 65535:
        raise AttnkitError(f"--port must be from 0 to 65535 (0: any free port), not {port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        raise AttnkitError(f"--host {host!r} is not an address here ({err})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise AttnkitError(
                f"port {port} on {host} is in use by another program; stop it or choose "
                "another --port"
            ) from None
        raise AttnkitError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    return sock
