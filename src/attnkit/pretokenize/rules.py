"""Pre-tokenization rules: a function text -> text applied before everything else, and who
may name one.

A rule is either one of attnkit's own (`RULES`: `lowercase`, `nfc`, `nfkc`, named bare) or the
user's own function, named `module:function` and imported. A run config is the user's own
file, so training imports the rule it names. A run folder is not: it may come from anyone,
and its `tokenizer.pretokenize.json` naming `subprocess:getoutput` would run every prompt as
a shell command. So loading a folder imports nothing by itself: a rule of `RULES` loads, and
another only when the user names it in `allow_rules` (`--allow-rule NAME`), as attnkit
refuses the pickles of a folder unless told otherwise.
"""

from __future__ import annotations

import importlib
import unicodedata
from collections.abc import Callable, Collection
from pathlib import Path

from attnkit.errors import AttnkitError

Rule = Callable[[str], str]

# attnkit's own rules, safe to load from any folder: no import, no effect beyond the text.
RULES: dict[str, Rule] = {
    "lowercase": str.lower,
    "nfc": lambda text: unicodedata.normalize("NFC", text),
    "nfkc": lambda text: unicodedata.normalize("NFKC", text),
}

ANY_RULE = None
"""`allowed` for a rule the user wrote into their own run config: any may be imported."""


def load_rule(
    name: str, allowed: Collection[str] | None = ANY_RULE, source: Path | None = None
) -> Rule:
    """The function `name` names: one of `RULES`, or `module:function` imported when `allowed`
    is `ANY_RULE` or holds `name`; `source` is the file that named it, for the refusal."""
    if name in RULES:
        return _checked(name, RULES[name])
    if allowed is not ANY_RULE and name not in allowed:
        where = f"{source} names" if source is not None else "this run names"
        raise AttnkitError(
            f"{where} the pre-tokenization rule {name!r}, code outside attnkit that loading a "
            f"run never imports on its own; if you trust it, pass --allow-rule {name} to "
            f"translate, generate or eval (allow_rules=[{name!r}] in Python), which attnkit "
            "serve never does"
        )
    module_name, _, function = name.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as err:
        raise AttnkitError(
            f"pretokenize.rule {name!r} cannot be loaded ({err}); put the module on PYTHONPATH"
        ) from None
    if not callable(found):
        raise AttnkitError(f"pretokenize.rule {name!r} is not a function")
    return _checked(name, found)


def _checked(name: str, rule: Rule) -> Rule:
    """`rule`, refusing in one sentence a result that is not text (an int, None)."""

    def apply(text: str) -> str:
        out = rule(text)
        if not isinstance(out, str):
            raise AttnkitError(
                f"pretokenize.rule {name!r} returned {type(out).__name__} {out!r:.40} for a "
                "text; a rule takes a text and returns the text rewritten"
            )
        return out

    return apply
