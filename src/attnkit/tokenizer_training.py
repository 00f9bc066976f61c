"""Tokenizer training: a vocabulary learned from text, in one of six kinds, over Hugging Face
`tokenizers` (the Rust implementation). `attnkit.tokenizer.Tokenizer.train` calls it.

- `bpe`: byte-pair encoding over characters, words marked by a leading `▁`
  (as sentencepiece), so decoding restores the spaces exactly;
- `byte-bpe`: byte-pair encoding over UTF-8 bytes (GPT-2): every string
  round-trips, there are no unknown tokens;
- `wordpiece`: BERT's greedy longest-match subwords, continuations marked `##`;
- `unigram`: the unigram language model of sentencepiece, over `▁`-marked words;
- `char`: one token per Unicode character;
- `word`: one token per word, the `vocab_size` most frequent kept and the rest
  `<unk>`. A word is a run of letters and digits with inner hyphens or
  apostrophes (`t-shirt`, `man's`), or a number with inner `.` or `,` (`3.5`);
  every other character but space is a token alone. Decoding joins the tokens
  with single spaces, so sacreBLEU's 13a tokens of the output are those of the
  text (but for `-`, `'` at a word's edge and non-ASCII punctuation, which 13a
  keeps attached: 0.3% of Multi30k's lines). Space-separated symbols, such as
  the letters and phonemes of `attnkit.data.cmudict`, are one token each.

A tokenizer trained here always has the same five special tokens at the same
ids, so models, data and decoders agree without asking:

    PAD_ID  = 0  <pad>   padding, ignored by attention and the loss
    BOS_ID  = 1  <s>     begin of sequence, the decoder's first input
    EOS_ID  = 2  </s>    end of sequence, where decoding stops
    UNK_ID  = 3  <unk>   a piece the vocabulary lacks (never produced by byte-bpe)
    MASK_ID = 4  <mask>  the masked-language-model token for encoders

A task may ask for more special tokens, which follow these five (T5's span
corruption: the sentinels `<extra_id_0>`, `<extra_id_1>`, ... at ids 5, 6, ...).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as Backend

from attnkit.checks import choice
from attnkit.errors import AttnkitError
from attnkit.files import PathLike, read_lines
from attnkit.pretokenize import Pretokenizer

PAD_ID, BOS_ID, EOS_ID, UNK_ID, MASK_ID = 0, 1, 2, 3, 4
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>", "<mask>")
KINDS = ("bpe", "byte-bpe", "wordpiece", "unigram", "char", "word")
# A `word` token: a number with inner . or , | letters and digits joined by - or ' | any other
# character but space, alone (`_` too, which \w would count as a letter).
WORD_PATTERN = r"\d+(?:[.,]\d+)+|[^\W_]+(?:[-'’][^\W_]+)*|[^\w\s]|_"
NORMALIZATIONS = ("none", "nfc", "nfd", "nfkc", "nfkd")
# The kinds whose own pre-tokenizer keeps a phrase's delimiter inside one word.
PHRASE_KINDS = ("bpe", "unigram", "word")


def train_backend(
    kind: str,
    *,
    files: Sequence[PathLike] = (),
    texts: Iterable[str] = (),
    vocab_size: int = 8000,
    min_frequency: int | None = None,
    normalization: str = "none",
    pretokenizer: Pretokenizer | None = None,
    extra_specials: Sequence[str] = (),
) -> tuple[Backend, int]:
    """A backend of `kind` trained on `files` and `texts`, and the lines it learned from
    (`attnkit.tokenizer.Tokenizer.train` says what each setting does)."""
    choice("tokenizer kind", kind, KINDS)
    choice("normalization", normalization, NORMALIZATIONS)
    if kind == "unigram" and min_frequency is not None:
        raise AttnkitError(
            "unigram tokenizers prune by likelihood and take no min_frequency; leave it unset"
        )
    smallest = len(SPECIAL_TOKENS) + len(extra_specials) + (256 if kind == "byte-bpe" else 1)
    if vocab_size < smallest:
        raise AttnkitError(
            f"vocab_size {vocab_size} is too small for a {kind} tokenizer; use at least {smallest}"
        )
    if min_frequency is None:
        min_frequency = 1 if kind in ("char", "word") else 2
    phrases = pretokenizer is not None and pretokenizer.config.phrases > 0
    if phrases and kind not in PHRASE_KINDS:
        raise AttnkitError(
            f"a {kind} tokenizer splits phrases again at their delimiter; use one of "
            f"{', '.join(PHRASE_KINDS)}, or unset pretokenize.phrases"
        )
    joiner = pretokenizer.config.phrase_delimiter if phrases else ""
    backend, trainer = _build(kind, vocab_size, min_frequency, joiner, extra_specials)
    if normalization != "none":
        backend.normalizer = getattr(normalizers, normalization.upper())()
    # A character vocabulary learns the newline as the character it is; the
    # subword kinds learn from sentences and get it in their alphabet.
    lines = _CountingLines(files, texts, keepends=kind == "char")
    if pretokenizer is not None:
        read = list(lines)
        pretokenizer.learn_from_text(read)
        lines = _CountingLines((), map(pretokenizer.text, read), keepends=kind == "char")
    backend.train_from_iterator(lines, trainer)
    if lines.count == 0:
        raise AttnkitError(
            "there is no text to train the tokenizer on; give files or texts that are not empty"
        )
    return backend, lines.count


def _build(
    kind: str,
    vocab_size: int,
    min_frequency: int,
    joiner: str = "",
    extra_specials: Sequence[str] = (),
) -> tuple[Backend, Any]:
    """An untrained backend and its trainer for one kind; a `word` token may hold `joiner`
    between its letters (a phrase's delimiter); `extra_specials` follow the five specials."""
    specials = [
        AddedToken(token, special=True, normalized=False)
        for token in (*SPECIAL_TOKENS, *extra_specials)
    ]
    common = {"vocab_size": vocab_size, "special_tokens": specials, "show_progress": False}
    # Sentences are learnt one a line without their newline, yet running text
    # for a language model has newlines: keep them out of <unk>.
    newline = {"initial_alphabet": ["\n"]}
    if kind == "bpe":
        backend = Backend(models.BPE(unk_token="<unk>"))
        trainer = trainers.BpeTrainer(min_frequency=min_frequency, **newline, **common)
    elif kind == "byte-bpe":
        backend = Backend(models.BPE())
        # All 256 bytes are in the alphabet from the start, so nothing is unknown.
        trainer = trainers.BpeTrainer(
            min_frequency=min_frequency,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            **common,
        )
    elif kind == "wordpiece":
        backend = Backend(models.WordPiece(unk_token="<unk>"))
        trainer = trainers.WordPieceTrainer(min_frequency=min_frequency, **common)
    elif kind == "unigram":
        backend = Backend(models.Unigram())
        trainer = trainers.UnigramTrainer(unk_token="<unk>", **newline, **common)
    else:
        backend = Backend(models.WordLevel(unk_token="<unk>"))
        trainer = trainers.WordLevelTrainer(min_frequency=min_frequency, **common)

    if kind == "byte-bpe":
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
    elif kind == "wordpiece":
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece()
    elif kind == "char":
        # Every code point alone, newlines included (`.` would skip them).
        backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        backend.decoder = decoders.Fuse()
    elif kind == "word":
        # No decoder: the backend then joins tokens with single spaces.
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.WhitespaceSplit(),
                pre_tokenizers.Split(Regex(_word_pattern(joiner)), behavior="isolated"),
            ]
        )
    else:
        # Spaces become part of the following piece (`▁`), so decoding puts
        # every space back where it was.
        backend.pre_tokenizer = pre_tokenizers.Metaspace()
        backend.decoder = decoders.Metaspace()
    return backend, trainer


def _word_pattern(joiner: str) -> str:
    """WORD_PATTERN, its words also joined by `joiner` if one is given."""
    if not joiner:
        return WORD_PATTERN
    return WORD_PATTERN.replace(
        "(?:[-'’][^\\W_]+)*", f"(?:(?:[-'’]|{re.escape(joiner)})[^\\W_]+)*", 1
    )


class _CountingLines:
    """The training text as one stream of lines, counted so an empty corpus is caught."""

    def __init__(self, files: Sequence[PathLike], texts: Iterable[str], keepends: bool) -> None:
        if isinstance(files, str | Path):
            files = [files]
        self.files, self.texts, self.keepends, self.count = list(files), texts, keepends, 0

    def __iter__(self) -> Iterator[str]:
        # Files in pieces: a corpus in one line is counted a piece at a time (`read_lines`).
        files = (read_lines(f, keepends=self.keepends, pieces=True) for f in self.files)
        for source in [*files, self.texts]:
            for line in source:
                if line.strip():
                    self.count += 1
                    yield line
