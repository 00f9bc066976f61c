"""The reference pages that are generated from the code, so that they cannot drift from it.

- ``{run-config}``: every key of every run-config section, from the section dataclasses
  (`attnkit.train.run_config.SECTIONS`) and `ModelConfig`: its type and default from the
  dataclass field, its allowed values from the `checks.choice` call that checks it, and its
  sentence from the class docstring's ``name: what it does`` entry. A key without a sentence
  is a build warning, which the docs build turns into an error.
- ``{run-folder}``: the files of a run folder, from the table in `attnkit.run`'s docstring,
  checked against the paths `RunFolder` names.

The command line's reference comes from its argparse parsers through sphinx-argparse, and
the Python API's from autodoc, whose docstrings `as_rst` reads in the project's own style.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

log = logging.getLogger(__name__)


# -- docstrings ------------------------------------------------------------------------------

ENTRY = re.compile(r"^([a-z_][a-z0-9_]*(?:, [a-z_][a-z0-9_]*)*): (.*)$")


def as_rst(lines: list[str]) -> list[str]:
    """A docstring in the project's style as reStructuredText, for autodoc.

    The project writes its docstrings for a reader of the source: ``name: what it is``
    entries with indented continuation lines, and indented blocks of code or tables after a
    sentence. Entries become a field list; any other indented block becomes a literal block.
    """
    out: list[str] = []
    entry = block = False
    for line in lines:
        indented = line.startswith((" ", "\t")) and bool(line.strip())
        head = ENTRY.match(line)
        if head:
            if out and out[-1].strip() and not entry:
                out.append("")  # a field list starts after a blank line
            out.append(f":{head.group(1)}: {head.group(2)}")
            entry, block = True, False
        elif entry and indented:
            out.append("   " + line.strip())
        elif indented and not block:  # an indented block after a sentence: set it as code
            while out and not out[-1].strip():
                out.pop()
            if out:
                out[-1] = out[-1] + (":" if out[-1].endswith(":") else " ::")
            out += ["", line]
            entry, block = False, True
        else:
            if (entry or block) and line.strip():
                out.append("")  # the list or block ends before this line
            entry, block = False, block and (indented or not line.strip())
            out.append(line)
    return out


def _process_docstring(app, what, name, obj, options, lines: list[str]) -> None:
    lines[:] = as_rst(lines)


# -- the run config --------------------------------------------------------------------------


def docstring_entries(cls: type) -> dict[str, str]:
    """The ``name: text`` entries of a class docstring, each name of ``a, b: text`` mapped to
    its text; an entry runs on over the lines indented below it."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    entries: dict[str, str] = {}
    names: list[str] = []
    for line in doc.splitlines():
        head = re.match(r"^([a-z_][a-z0-9_]*(?:, [a-z_][a-z0-9_]*)*): (.*)$", line)
        if head:
            names = head.group(1).split(", ")
            for name in names:
                entries[name] = head.group(2)
        elif line.startswith((" ", "\t")) and names:
            for name in names:
                entries[name] += " " + line.strip()
        else:
            names = []
    return entries


def choices_checked(cls: type) -> dict[str, tuple[str, ...]]:
    """For each field of `cls` that a `choice(NAME, <obj>.FIELD, ALLOWED)` call checks, in the
    class's module or a module it imports a `check_*` function from, the allowed values."""
    module = sys.modules[cls.__module__]
    modules = [module]
    for name, value in vars(module).items():
        if name.startswith("check_") and callable(value) and value.__module__ != module.__name__:
            modules.append(sys.modules[value.__module__])
    fields = {f.name for f in dataclasses.fields(cls)}
    found: dict[str, tuple[str, ...]] = {}
    for mod in modules:
        tree = ast.parse(inspect.getsource(mod))
        for call in ast.walk(tree):
            if not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id == "choice"
                and len(call.args) == 3
                and isinstance(call.args[1], ast.Attribute)
                and call.args[1].attr in fields
            ):
                continue
            allowed = eval(compile(ast.Expression(call.args[2]), mod.__name__, "eval"), vars(mod))
            found[call.args[1].attr] = tuple(allowed)
    return found


def type_name(hint: Any) -> str:
    """A type hint as a reader of a TOML file needs it: int, float, string, list of strings."""
    names = {int: "integer", float: "number", str: "string", bool: "true or false"}
    if hint in names:
        return names[hint]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin in (tuple, list):
        return f"list of {type_name(args[0])}s"
    if origin is dict:
        return "table"
    if len(args) < len(typing.get_args(hint)):  # Optional: unset means "derived"
        return f"{' or '.join(type_name(a) for a in args)}, optional"
    return " or ".join(type_name(a) for a in args)


def toml_default(value: Any) -> str:
    from attnkit.train.toml_values import toml_value

    return "unset" if value is None else toml_value(value)


@dataclasses.dataclass(frozen=True)
class Key:
    name: str
    type: str
    default: str
    allowed: tuple[str, ...]
    sentence: str | None


def section_keys(section: str) -> list[Key]:
    """Every key of the run config's `section`, in the dataclass's order."""
    from attnkit.config import ModelConfig
    from attnkit.train.run_config import SECTIONS, TOKENIZER_SIZES

    cls = ModelConfig if section == "model" else SECTIONS[section]
    entries, allowed = docstring_entries(cls), choices_checked(cls)
    hints = typing.get_type_hints(cls)
    keys = []
    if section == "model":
        from attnkit.presets import PRESETS

        preset_doc = "a named model to start from, its fields overridden by the keys below"
        keys.append(Key("preset", "string, optional", "unset", tuple(PRESETS), preset_doc))
    for field in dataclasses.fields(cls):
        if section == "model" and field.name in TOKENIZER_SIZES:
            continue  # the tokenizer sets them; the section refuses them
        default = (
            field.default if field.default is not dataclasses.MISSING else field.default_factory()  # type: ignore[misc]
        )
        keys.append(
            Key(
                field.name,
                type_name(hints[field.name]),
                toml_default(default),
                allowed.get(field.name, ()),
                entries.get(field.name),
            )
        )
    return keys


def sections() -> list[tuple[str, str]]:
    """Each section's name and the first line of its class docstring."""
    from attnkit.config import ModelConfig
    from attnkit.train.run_config import SECTIONS

    out = []
    for name, cls in SECTIONS.items():
        cls = ModelConfig if name == "model" else cls
        out.append((name, inspect.cleandoc(cls.__doc__ or "").splitlines()[0]))
    return out


def _table(
    headers: list[str], rows: list[list[nodes.Node | str]], widths: list[int]
) -> nodes.table:
    table = nodes.table(classes=["longtable"])
    group = nodes.tgroup(cols=len(headers))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    group += head
    row = nodes.row()
    for text in headers:
        row += nodes.entry("", nodes.paragraph(text=text))
    head += row
    body = nodes.tbody()
    group += body
    for cells in rows:
        row = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            entry += cell if isinstance(cell, nodes.Node) else nodes.paragraph(text=cell)
            row += entry
        body += row
    return table


def _literal(text: str) -> nodes.paragraph:
    para = nodes.paragraph()
    para += nodes.literal(text=text)
    return para


def _words(text: str) -> nodes.paragraph:
    """A sentence whose `backticked` words are set as code."""
    para = nodes.paragraph()
    for i, part in enumerate(re.split(r"`([^`]*)`", text)):
        para += nodes.literal(text=part) if i % 2 else nodes.Text(part)
    return para


class RunConfigDirective(SphinxDirective):
    """``{run-config}``: one section per run-config section, each key a row."""

    def run(self) -> list[nodes.Node]:
        out: list[nodes.Node] = []
        for name, summary in sections():
            section = nodes.section(ids=[f"section-{name.replace('_', '-')}"])
            section += nodes.title(text=f"[{name}]")
            section += _words(summary)
            rows = []
            for key in section_keys(name):
                if key.sentence is None:
                    log.warning(
                        "run-config key %s.%s has no sentence: add a `%s: ...` entry to its "
                        "class docstring",
                        name, key.name, key.name,
                        location=self.get_location(),
                    )  # fmt: skip
                allowed = ", ".join(key.allowed)
                rows.append(
                    [
                        _literal(f"{name}.{key.name}"),
                        key.type,
                        _literal(key.default),
                        _literal(allowed) if allowed else "",
                        _words(key.sentence or ""),
                    ]
                )
            section += _table(["key", "type", "default", "allowed", "what it does"], rows,
                              [18, 10, 10, 14, 48])  # fmt: skip
            out.append(section)
        return out


# -- the run folder --------------------------------------------------------------------------


def run_folder_files() -> list[tuple[str, str]]:
    """The (path, what it holds) rows of the table in `attnkit.run`'s docstring."""
    module = importlib.import_module("attnkit.run")
    rows: list[tuple[str, str]] = []
    indent = None  # a row's path's; a line indented deeper goes on with its description
    for line in textwrap.dedent(module.__doc__ or "").splitlines():
        depth = len(line) - len(line.lstrip())
        match = re.match(r"^RUN_DIR/(\S.*?)\s{2,}(.*)$", line.strip())
        if match:
            rows.append((match.group(1), match.group(2)))
            indent = depth
        elif indent is not None and line.strip() and depth > indent:
            path, text = rows[-1]
            rows[-1] = (path, f"{text} {line.strip()}")
        else:
            indent = None
    return rows


def run_folder_names() -> set[str]:
    """The names `RunFolder` gives its files and folders."""
    from attnkit.run import RunFolder

    folder = RunFolder("RUN_DIR")
    return {
        value.relative_to("RUN_DIR").parts[0]
        for value in vars(folder).values()
        if isinstance(value, Path) and value != folder.root
    }


class RunFolderDirective(SphinxDirective):
    """``{run-folder}``: the run folder's files as a table."""

    def run(self) -> list[nodes.Node]:
        rows = run_folder_files()
        listed = " ".join(path for path, _ in rows)
        for name in sorted(run_folder_names()):
            if name not in listed:
                log.warning(
                    "RunFolder names %s, which attnkit.run's docstring does not list",
                    name,
                    location=self.get_location(),
                )
        body = [[_literal(f"RUN_DIR/{path}"), _words(what)] for path, what in rows]
        return [_table(["file", "what it holds"], body, [30, 70])]


def setup(app) -> dict[str, Any]:
    app.add_directive("run-config", RunConfigDirective)
    app.add_directive("run-folder", RunFolderDirective)
    app.connect("autodoc-process-docstring", _process_docstring)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
