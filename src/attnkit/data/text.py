"""Parallel text readers: sentence pairs, from two aligned files or one file of pairs.

Parallel text comes as two aligned files (line i of one translates line i of
the other) or as one file of pairs, tab-separated (`.tsv`) or JSON lines
(`.jsonl`). Any of them may be gzipped (`.gz`): lines are read by
`attnkit.files.read_lines`. Bad input stops with the file and line at
fault: a line count that differs between two aligned files, a pair line that
is not a pair.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from attnkit.errors import AttnkitError
from attnkit.files import PathLike, read_lines


def read_aligned(src_path: PathLike, tgt_path: PathLike) -> Iterator[tuple[str, str]]:
    """Yield (source, target) lines from two aligned files, which must have equally many lines."""
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    n = 0
    for n, src in enumerate(src_lines, start=1):
        tgt = next(tgt_lines, None)
        if tgt is None:
            _raise_mismatch(src_path, n + sum(1 for _ in src_lines), tgt_path, n - 1)
        yield src, tgt
    rest = sum(1 for _ in tgt_lines)
    if rest:
        _raise_mismatch(src_path, n, tgt_path, n + rest)


def _raise_mismatch(src_path: PathLike, n_src: int, tgt_path: PathLike, n_tgt: int) -> None:
    raise AttnkitError(
        f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}; aligned parallel files "
        "need one line per sentence on both sides"
    )


def read_pairs(
    path: PathLike, *, keys: tuple[str, str] = ("src", "tgt")
) -> Iterator[tuple[str, str]]:
    """Yield (source, target) pairs from one `.tsv` or `.jsonl` file (optionally `.gz`).

    A TSV line is `source<TAB>target`. A JSONL line is an object with the two
    `keys`, or a two-element list.
    """
    path = Path(path)
    suffixes = [s for s in path.suffixes if s != ".gz"]
    fmt = suffixes[-1] if suffixes else ""
    if fmt not in (".tsv", ".jsonl"):
        raise AttnkitError(
            f"{path} is neither .tsv nor .jsonl; give a file of pairs one of those suffixes "
            "or pass the source and target as two aligned files"
        )
    parse = _parse_tsv if fmt == ".tsv" else _parse_jsonl
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            # An empty line is an empty pair: the dataset skips and counts it.
            yield "", ""
            continue
        pair = parse(line, keys)
        if pair is None:
            expected = "source<TAB>target" if fmt == ".tsv" else f"an object with {keys} or a pair"
            raise AttnkitError(f"{path} line {number} is not a pair; expected {expected}")
        yield pair


def _parse_tsv(line: str, keys: tuple[str, str]) -> tuple[str, str] | None:
    fields = line.split("\t")
    return (fields[0], fields[1]) if len(fields) == 2 else None


def _parse_jsonl(line: str, keys: tuple[str, str]) -> tuple[str, str] | None:
    try:
        item = json.loads(line)
    except json.JSONDecodeError:
        return None
    if isinstance(item, dict) and all(isinstance(item.get(k), str) for k in keys):
        return item[keys[0]], item[keys[1]]
    if isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
        return item[0], item[1]
    return None


def read_parallel(
    src_path: PathLike, tgt_path: PathLike | None = None
) -> Iterator[tuple[str, str]]:
    """Pairs from two aligned files, or from one TSV/JSONL file of pairs when `tgt_path` is None."""
    if tgt_path is None:
        return read_pairs(src_path)
    return read_aligned(src_path, tgt_path)
