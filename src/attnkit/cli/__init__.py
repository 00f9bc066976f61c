"""The command line (`attnkit ...`): each module wires one group of commands to the library.

`main` is the console script's entry point; nothing in the library imports this package.
"""

from attnkit.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
