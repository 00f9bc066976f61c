"""The words before the tokens: what happens to text before a tokenizer or a word-vector
vocabulary sees it, in this order:

    rule       a function text -> text on the raw text: attnkit's own (`lowercase`, `nfkc`) or
               the user's (`module:function`), which a loaded folder never imports unasked
               (`rules.py`)
    segment    jieba cuts text written without spaces (Chinese) into words (`segment.py`)
    phrases    pairs of words that occur together far more than chance become one token,
               learned from the training text (`phrases.py`; `phrases` passes)
    stop words function words leave the sentence (`stopwords.py`; word vectors only)
    stem       each word becomes its stem or lemma (`stems.py`; word vectors only)

Word vectors take the words (`Pretokenizer.words`). A Transformer's tokenizer takes
text (`Pretokenizer.text`): the rule applied, a space put between the words jieba
finds, and the spaces inside each phrase replaced by its delimiter ("New York" ->
"New_York") where nothing but spaces stood between its words, the rest of the text
left as it was; `Pretokenizer.restore` undoes the phrases and jieba's spaces when ids
are decoded. Stop words and stems lose words for good, so only word vectors take them.

The settings are the [pretokenize] section of a run config (`PretokenizeConfig`); the
learned phrases travel with them (`to_dict`), saved beside the tokenizer.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnkit.checks import check, choice, finite_fields, non_negative, positive
from attnkit.errors import AttnkitError
from attnkit.files import PathLike, atomic_write
from attnkit.pretokenize import segment as jieba_segment
from attnkit.pretokenize.phrases import Phrases
from attnkit.pretokenize.rules import ANY_RULE, RULES, load_rule
from attnkit.pretokenize.segment import SEGMENTERS
from attnkit.pretokenize.stems import STEMMERS, stemmer
from attnkit.pretokenize.stopwords import stop_words

# The words phrases are found among in running text: letters and digits, with inner hyphens and
# apostrophes. A phrase joins words with nothing but spaces between them.
_WORD = re.compile(r"[^\W_]+(?:[-'’][^\W_]+)*")


@dataclass(frozen=True)
class PretokenizeConfig:
    """The [pretokenize] section: every option off by default.

    rule: one of attnkit's rules (`lowercase`, `nfc`, `nfkc`), or `module:function`, a
        function of yours that takes a text and returns it rewritten, applied first (the
        module must be importable: on PYTHONPATH; a run folder that names it loads only
        with `--allow-rule module:function`).
    segment: `jieba` cuts Chinese text into words; `none`.
    phrases: passes of phrase detection (0: none; 1: pairs; 2: up to four words).
    phrase_min_count, phrase_threshold, phrase_delimiter, phrase_connectors: gensim's
        `min_count` (delta), `threshold`, `delimiter` and `connector_words`.
    stop_words: `spacy` (spaCy's list for `language`) or a file of words, one a line;
        empty: none. Word vectors only.
    stem: `snowball` (stems), `lemma` (simplemma's lemmas) or `none`. Word vectors only.
    language: the ISO 639-1 code of the text, for stop words and stems.
    """

    rule: str = ""
    segment: str = "none"
    phrases: int = 0
    phrase_min_count: int = 5
    phrase_threshold: float = 10.0
    phrase_delimiter: str = "_"
    phrase_connectors: tuple[str, ...] = ()
    stop_words: str = ""
    stem: str = "none"
    language: str = "en"

    def __post_init__(self) -> None:
        finite_fields(self, "pretokenize")
        choice("pretokenize.segment", self.segment, SEGMENTERS)
        choice("pretokenize.stem", self.stem, STEMMERS)
        non_negative("pretokenize.phrases", self.phrases)
        positive("pretokenize.phrase_threshold", self.phrase_threshold)
        non_negative("pretokenize.phrase_min_count", self.phrase_min_count)
        check(
            bool(self.phrase_delimiter) and not any(c.isspace() for c in self.phrase_delimiter),
            f"pretokenize.phrase_delimiter must be text without spaces, not "
            f"{self.phrase_delimiter!r}",
        )
        check(
            not self.rule or self.rule in RULES or re.fullmatch(r"[\w.]+:\w+", self.rule),
            f"pretokenize.rule {self.rule!r} must be one of {', '.join(RULES)} or name a "
            "function as module:function",
        )

    @property
    def on(self) -> bool:
        return self != PretokenizeConfig()

    @property
    def lossy(self) -> list[str]:
        """The options set that drop or change words for good: for word vectors only."""
        chosen = {"stop_words": bool(self.stop_words), "stem": self.stem != "none"}
        return [f"pretokenize.{key}" for key, on in chosen.items() if on]


class Pretokenizer:
    """The steps `config` asks for, and the phrases learned for them.

    allowed: the rules besides attnkit's own that may be imported (`rules.load_rule`):
        `ANY_RULE` for a config the user wrote; a folder's file is read with the names the
        user allowed (`read`), none by default.
    source: the file the config was read from, named when its rule is refused.
    """

    def __init__(
        self,
        config: PretokenizeConfig,
        phrases: Phrases | None = None,
        rule: Callable[[str], str] | None = None,
        allowed: Collection[str] | None = ANY_RULE,
        source: Path | None = None,
    ) -> None:
        self.config, self.phrases = config, phrases
        self.rule = rule or (load_rule(config.rule, allowed, source) if config.rule else None)
        self._stop = stop_words(config.stop_words, config.language) if config.stop_words else None
        self._stem = stemmer(config.stem, config.language) if config.stem != "none" else None

    # -- learning ----------------------------------------------------------------------

    def learn(self, sentences: Iterable[Sequence[str]]) -> None:
        """Learn the phrases (if asked) from `sentences` of words, as `split` gives them: a
        list, or an iterable that reads its source afresh each time (one reading a pass)."""
        if self.config.phrases:
            c = self.config
            self.phrases = Phrases.learn(
                sentences, c.phrases, min_count=c.phrase_min_count,
                threshold=c.phrase_threshold, delimiter=c.phrase_delimiter,
                connectors=c.phrase_connectors,
            )  # fmt: skip

    def learn_from_text(self, lines: Iterable[str]) -> None:
        """`learn` from running text, as `text` will see it: each run of words with only
        spaces between them a sentence."""
        if self.config.phrases:
            runs = (run for line in lines for run in _runs(self._prepared(line)))
            self.learn([[word for word, _ in run] for run in runs])

    # -- word vectors ------------------------------------------------------------------

    def split(self, line: str, split_words: Callable[[str], list[str]]) -> list[str]:
        """The words of `line`: the rule, then jieba's words or `split_words`' (which also
        drops the punctuation jieba keeps)."""
        line = self.rule(line) if self.rule else line
        if self.config.segment == "jieba":
            return [w for piece in jieba_segment.segment(line) for w in split_words(piece)]
        return split_words(line)

    def words(self, words: Sequence[str]) -> list[str]:
        """The words after phrases, stop words and stems."""
        out = self.phrases.join(words) if self.phrases else list(words)
        if self._stop is not None:
            out = [w for w in out if w.lower() not in self._stop]
        if self._stem is not None:
            delimiter = self.config.phrase_delimiter
            out = [delimiter.join(map(self._stem, w.split(delimiter))) for w in out]
        return out

    # -- a tokenizer's text ------------------------------------------------------------

    def text(self, text: str) -> str:
        """`text` as a tokenizer reads it: the rule, jieba's spaces, the phrases joined."""
        if self.config.lossy:
            raise AttnkitError(
                f"{' and '.join(self.config.lossy)} drop or change words for good, which only "
                "word vectors may do; unset them for a tokenizer"
            )
        text = self._prepared(text)
        if not self.phrases:
            return text
        out, at = [], 0
        for run in _runs(text):
            words = [word for word, _ in run]
            i = 0
            for _, taken in _spans(self.phrases, words):
                if taken > 1:
                    joined = self.config.phrase_delimiter.join(words[i : i + taken])
                    out += [text[at : run[i][1][0]], joined]
                    at = run[i + taken - 1][1][1]
                i += taken
        return "".join([*out, text[at:]])

    def _prepared(self, text: str) -> str:
        """The rule applied and jieba's spaces put in."""
        text = self.rule(text) if self.rule else text
        if self.config.segment == "jieba":
            text = jieba_segment.join_segmented(text)
        return text

    def restore(self, text: str) -> str:
        """Decoded `text` with each phrase's words apart again and jieba's spaces taken out."""
        if self.phrases:
            known = {p for model in self.phrases.passes for p in model.scores}
            delimiter = self.config.phrase_delimiter
            pattern = rf"[^\s]*{re.escape(delimiter)}[^\s]*"
            text = re.sub(
                pattern,
                lambda m: _unjoin(m.group(), known, delimiter),
                text,
            )
        if self.config.segment == "jieba":
            text = jieba_segment.unjoin(text)
        return text

    # -- files -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        config = dataclasses.asdict(self.config)
        config["phrase_connectors"] = list(config["phrase_connectors"])
        return {"config": config, "phrases": self.phrases.to_dict() if self.phrases else None}

    def save(self, path: PathLike) -> Path:
        """Write the settings and phrases to a JSON file."""
        text = json.dumps(self.to_dict(), ensure_ascii=False, indent=1)
        return atomic_write(Path(path), lambda p: p.write_text(text, encoding="utf-8"))

    @classmethod
    def read(cls, path: PathLike, allow_rules: Collection[str] = ()) -> Pretokenizer | None:
        """The pretokenizer `save` wrote to `path`, or None if there is no such file. A rule
        it names that is not attnkit's own is imported only if `allow_rules` names it."""
        path = Path(path)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls.from_dict(data, allow_rules, source=path)
        except (ValueError, KeyError, TypeError) as err:
            raise AttnkitError(f"{path} is not a pretokenizer attnkit wrote ({err})") from None

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], allow_rules: Collection[str] = (), source: Path | None = None
    ) -> Pretokenizer:
        """The pretokenizer `to_dict` gave; its rule, if not attnkit's own, must be in
        `allow_rules` (the data may come from anyone's file)."""
        settings = dict(data["config"])
        settings["phrase_connectors"] = tuple(settings["phrase_connectors"])
        phrases = Phrases.from_dict(data["phrases"]) if data.get("phrases") else None
        return cls(PretokenizeConfig(**settings), phrases, allowed=allow_rules, source=source)


def _runs(text: str) -> list[list[tuple[str, tuple[int, int]]]]:
    """The words of `text` with their spans, in runs that only spaces separate."""
    runs: list[list[tuple[str, tuple[int, int]]]] = []
    end = None
    for match in _WORD.finditer(text):
        if end is None or text[end : match.start()].strip():
            runs.append([])
        runs[-1].append((match.group(), match.span()))
        end = match.end()
    return runs


def _spans(phrases: Phrases, words: list[str]) -> list[tuple[str, int]]:
    """Each token of the last pass and how many of `words` it covers."""
    spans = [(w, 1) for w in words]
    for model in phrases.passes:
        tokens = [t for t, _ in spans]
        out, i = [], 0
        for token, taken in model.spans(tokens):
            out.append((token, sum(n for _, n in spans[i : i + taken])))
            i += taken
        spans = out
    return spans


def _unjoin(token: str, known: set[str], delimiter: str) -> str:
    """A phrase token (perhaps with punctuation at its edges) with its words apart."""
    match = re.search(rf"[\w{re.escape(delimiter)}'’-]+", token)
    if match and match.group() in known:
        inner = match.group().replace(delimiter, " ")
        return token[: match.start()] + inner + token[match.end() :]
    return token
