"""Phrases: word pairs that occur together far more often than chance, made one token.

Mikolov et al. (2013, section 4) score each pair of neighbouring words a b by

    score(a, b) = (count(a b) - delta) / (count(a) count(b)) * |V|

where delta (`min_count`) discounts pairs seen too rarely to judge and |V| is
the number of distinct words and pairs counted, as gensim's `Phrases` scales it,
so that a `threshold` (10) means the same on corpora of any size. A pair above it
becomes one token, its words joined by `delimiter` ("new_york"); a sentence is
read left to right, each word joined to the next when they score, and a joined
pair's last word starts no new one. Connector words (`connectors`: "of", "the",
...) may sit inside a phrase ("bank_of_america") but never start or end one.
Another pass over the joined text finds longer phrases (`passes` 2: up to four
words). Counts and scores are gensim's (its tests compare the two); gensim's
pruning of a vocabulary past 40 million entries is not done here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from attnkit.errors import AttnkitError


@dataclass
class PhraseModel:
    """The phrases of one pass: each joined phrase and its score."""

    scores: dict[str, float]
    delimiter: str = "_"
    connectors: frozenset[str] = field(default_factory=frozenset)

    def join(self, sentence: Sequence[str]) -> list[str]:
        """`sentence` with each phrase found made one token (gensim's `Phrases[sentence]`)."""
        return [token for token, _ in self.spans(sentence)]

    def spans(self, sentence: Sequence[str]) -> Iterator[tuple[str, int]]:
        """Each output token and how many input words it took."""
        start: str | None = None
        between: list[str] = []
        for word in sentence:
            if word in self.connectors:
                if start is None:
                    yield word, 1
                else:
                    between.append(word)
                continue
            if start is not None:
                phrase = self.delimiter.join([start, *between, word])
                if phrase in self.scores:
                    yield phrase, len(between) + 2
                    start, between = None, []
                    continue
                yield start, 1
                yield from ((w, 1) for w in between)
            start, between = word, []
        if start is not None:
            yield start, 1
            yield from ((w, 1) for w in between)


def learn_phrases(
    sentences: Iterable[Sequence[str]],
    min_count: int = 5,
    threshold: float = 10.0,
    delimiter: str = "_",
    connectors: Iterable[str] = (),
) -> PhraseModel:
    """The pairs of `sentences` that score above `threshold` (one pass)."""
    if not delimiter or any(ch.isspace() for ch in delimiter):
        raise AttnkitError(f"a phrase delimiter must be text without spaces, not {delimiter!r}.")
    connectors = frozenset(connectors)
    counts: Counter[str] = Counter()
    ends: dict[str, tuple[str, str]] = {}  # each candidate's first and last word
    for sentence in sentences:
        start: str | None = None
        between: list[str] = []
        for word in sentence:
            if word in connectors:
                if start is not None:
                    between.append(word)
                continue
            counts[word] += 1
            if start is not None:
                phrase = delimiter.join([start, *between, word])
                counts[phrase] += 1
                ends[phrase] = (start, word)
            start, between = word, []  # a word ends one candidate and begins the next
    size = len(counts)  # words and candidates: gensim's len(vocab)
    scores: dict[str, float] = {}
    for phrase, (first, last) in ends.items():
        score = (counts[phrase] - min_count) / (counts[first] * counts[last]) * size
        if score > threshold:
            scores[phrase] = score
    return PhraseModel(scores, delimiter, connectors)


@dataclass
class Phrases:
    """One `PhraseModel` per pass, applied in turn."""

    passes: list[PhraseModel]

    @classmethod
    def learn(cls, sentences: Iterable[Sequence[str]], passes: int = 1, **settings: Any) -> Phrases:
        """`passes` passes over `sentences` (a list, or an iterable that reads its source
        afresh each time: each pass reads it again), each on the text the passes before it
        joined."""
        models: list[PhraseModel] = []
        for _ in range(passes):
            joined = (cls(models).join(s) for s in sentences)
            models.append(learn_phrases(joined, **settings))
        return cls(models)

    def join(self, sentence: Sequence[str]) -> list[str]:
        out = list(sentence)
        for model in self.passes:
            out = model.join(out)
        return out

    def __len__(self) -> int:
        return sum(len(m.scores) for m in self.passes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passes": [
                {"scores": m.scores, "delimiter": m.delimiter, "connectors": sorted(m.connectors)}
                for m in self.passes
            ]
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Phrases:
        return cls(
            [
                PhraseModel(p["scores"], p["delimiter"], frozenset(p["connectors"]))
                for p in data["passes"]
            ]
        )
