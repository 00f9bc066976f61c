"""The command line: `attnkit COMMAND ...`, every command named in `attnkit --help`.

Only wiring lives here and in the modules of each group of commands (`train`,
`inference`, `embed`, `serve`, `interop`): each command parses its options,
calls the library, and shows progress and results. Bad input from anywhere
below arrives as an `AttnkitError` and is printed as its one sentence, without
a traceback.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import platform
import sys
from typing import NoReturn

from attnkit.cli.distribution import add_distribution_parser
from attnkit.cli.embed import add_embed_parser
from attnkit.cli.inference import add_inference_parsers
from attnkit.cli.interop import add_interop_parsers
from attnkit.cli.serve import add_serve_parser
from attnkit.cli.train import add_train_parsers
from attnkit.errors import AttnkitError

log = logging.getLogger("attnkit")


class _Closed(io.TextIOBase):
    """A standard stream the shell closed (`>&-`, `<&-`), which Python gives as None: a command
    that uses it stops in one sentence, not with an AttributeError from deep inside."""

    def __init__(self, name: str, fix: str) -> None:
        self.name, self.fix = name, fix

    def _refuse(self, *_: object) -> NoReturn:
        raise AttnkitError(f"standard {self.name} is closed; {self.fix}")

    write = read = readline = _refuse
    buffer = property(_refuse)

    def flush(self) -> None:  # Python flushes standard output at exit: nothing to do
        pass


def build_parser() -> argparse.ArgumentParser:
    import torch

    from attnkit import __version__

    parser = argparse.ArgumentParser(prog="attnkit")
    versions = f"torch {torch.__version__}, Python {platform.python_version()}"
    parser.add_argument(
        "--version",
        action="version",
        version=f"attnkit {__version__} ({versions})",
        help="print attnkit's version (and torch's and Python's) and exit",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_train_parsers(sub)
    add_inference_parsers(sub)
    add_embed_parser(sub)
    add_distribution_parser(sub)
    add_serve_parser(sub)
    add_interop_parsers(sub)
    # Named from the parsers themselves, so that a new command cannot be left out.
    parser.description = (
        f"attnkit, a Transformer toolkit on PyTorch. Commands: {', '.join(sub.choices)}. "
        "attnkit COMMAND --help says more about each."
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()  # the first heavy imports (torch): a Ctrl-C here is one too
    except KeyboardInterrupt:
        print("attnkit: interrupted", file=sys.stderr)
        return 130
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if sys.stdin is None:
        sys.stdin = _Closed("input", "give the text with --input FILE, or open standard input")
    if sys.stdout is None:
        sys.stdout = _Closed(
            "output",
            "redirect it to a file (> FILE, or --output FILE where the command has one) "
            "or leave it open",
        )
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, where a closed pipe can still be handled
        return code
    except BrokenPipeError:
        # The reader left (`| head`): stop quietly; stdout to devnull, so exit's flush passes.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by it
    except AttnkitError as err:
        print(f"attnkit: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnkit: interrupted", file=sys.stderr)
        return 130
    except OSError as err:  # a full disk or a refused file where no check of attnkit's looked
        if args.verbose or err.strerror is None:
            raise
        where = f" ({err.filename})" if err.filename else ""
        print(f"attnkit: error: {err.strerror}{where}; the command stopped there", file=sys.stderr)
        return 1
    except Exception as err:  # no check foresaw it: still one sentence, the traceback on ask
        if args.verbose:
            raise
        library = type(err).__module__.split(".")[0]
        print(
            f"attnkit: error: {library} failed where attnkit did not expect it ("
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no message'}); "
            "run again as attnkit --verbose ... for the traceback, and please report it",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
