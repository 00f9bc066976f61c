"""Tokens: one `Tokenizer` facade over Hugging Face `tokenizers` (the Rust implementation).

Text becomes ids and ids become text again, a batch at a time, with padding and
truncation done here, counted and visible. A tokenizer is trained here in one of
six kinds (`bpe`, `byte-bpe`, `wordpiece`, `unigram`, `char`, `word`: see
`attnkit.tokenizer_training`), always with the same five special tokens at the
same ids (`<pad>` 0, `<s>` 1, `</s>` 2, `<unk>` 3, `<mask>` 4), so models,
data and decoders agree without asking.

A `Pretokenizer` (`attnkit.pretokenize`: the user's rule, jieba's words,
phrases) may rewrite text before the model sees it and after ids are decoded;
it is learned with the vocabulary and saved beside it, as `tokenizer.pretokenize.json`.

Any Hugging Face `tokenizer.json` loads too; its own special tokens (`[PAD]`,
`[CLS]`, `[SEP]`, `[UNK]`, `[MASK]`, `<|endoftext|>`, ...) are found by name,
so `pad_id` and the others are right for it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend

from attnkit.checks import of_type, token_ids
from attnkit.errors import AttnkitError
from attnkit.files import PathLike, atomic_write, check_utf8
from attnkit.pretokenize import Pretokenizer
from attnkit.tokenizer_training import BOS_ID as BOS_ID
from attnkit.tokenizer_training import EOS_ID as EOS_ID
from attnkit.tokenizer_training import KINDS as KINDS
from attnkit.tokenizer_training import MASK_ID as MASK_ID
from attnkit.tokenizer_training import PAD_ID as PAD_ID
from attnkit.tokenizer_training import SPECIAL_TOKENS as SPECIAL_TOKENS
from attnkit.tokenizer_training import UNK_ID as UNK_ID
from attnkit.tokenizer_training import train_backend

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"  # its name in a run folder and in a Hugging Face folder
PRETOKENIZE_SUFFIX = (
    ".pretokenize.json"  # tokenizer.json's pretokenizer: tokenizer.pretokenize.json
)

# Names under which the usual tokenizer families spell each role: attnkit and
# fairseq/RoBERTa (`<s>`), BERT (`[CLS]`), GPT-2 (`<|endoftext|>` for both ends).
_ROLE_NAMES = {
    "pad": ("<pad>", "[PAD]", "<|pad|>", "<|padding|>"),
    "bos": ("<s>", "[CLS]", "<bos>", "<|startoftext|>", "<|begin_of_text|>", "<|endoftext|>"),
    "eos": ("</s>", "[SEP]", "<eos>", "<|end_of_text|>", "<|endoftext|>"),
    "unk": ("<unk>", "[UNK]", "<|unk|>"),
    "mask": ("<mask>", "[MASK]"),
}


class Tokenizer:
    """Text to ids and back, batched; see the module docstring for the special ids."""

    def __init__(self, backend: Backend, pretokenizer: Pretokenizer | None = None) -> None:
        # Padding and truncation are done here, counted and visible, never by
        # settings hidden inside a loaded tokenizer.json.
        backend.no_padding()
        backend.no_truncation()
        self.backend = backend
        self.pretokenizer = pretokenizer
        self._special = _find_special_ids(backend)
        self.n_truncated = 0
        """How many sequences `encode` and `encode_batch` have truncated so far."""

    # -- training ---------------------------------------------------------

    @classmethod
    def train(
        cls,
        kind: str = "bpe",
        *,
        files: Sequence[PathLike] = (),
        texts: Iterable[str] = (),
        vocab_size: int = 8000,
        min_frequency: int | None = None,
        normalization: str = "none",
        pretokenizer: Pretokenizer | None = None,
        extra_specials: Sequence[str] = (),
    ) -> Tokenizer:
        """Learn a vocabulary of `vocab_size` tokens (the five specials included).

        files: text files, one sentence or paragraph a line (`.gz` is read too).
        texts: strings, for text already in memory; used together with `files`.
        min_frequency: the fewest occurrences a merge or token needs; defaults
            to 2, and to 1 for `char` and `word` (whose `vocab_size` alone cuts the
            rarest). Unigram prunes by likelihood, not by count, so it takes none.
        normalization: the Unicode normal form applied before tokenizing
            (`nfc`, `nfd`, `nfkc`, `nfkd`) or `none`, which keeps the text as
            it is and so lets byte-level BPE round-trip any string exactly.
        pretokenizer: learns its phrases from the same text, which it then rewrites
            before the vocabulary is learned (`attnkit.pretokenize`).
        extra_specials: special tokens of a task, at the ids after the five specials (T5's
            sentinels, `attnkit.data.span_corruption.sentinel_tokens`).
        """
        backend, count = train_backend(
            kind,
            files=files,
            texts=texts,
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            normalization=normalization,
            pretokenizer=pretokenizer,
            extra_specials=extra_specials,
        )
        tokenizer = cls(backend, pretokenizer)
        logger.info(
            "trained a %s tokenizer of %d tokens on %d lines",
            kind,
            tokenizer.vocab_size,
            count,
        )
        return tokenizer

    @classmethod
    def train_pair(
        cls,
        kind: str = "bpe",
        *,
        src_files: Sequence[PathLike],
        tgt_files: Sequence[PathLike],
        joint: bool = True,
        **options: Any,
    ) -> tuple[Tokenizer, Tokenizer]:
        """Source and target tokenizers for translation.

        joint: one vocabulary learned from both sides and shared by them (the
            paper's shared BPE, needed to tie all embeddings); otherwise one
            vocabulary per side, each of `vocab_size` tokens.
        """
        if joint:
            shared = cls.train(kind, files=[*src_files, *tgt_files], **options)
            return shared, shared
        return cls.train(kind, files=src_files, **options), cls.train(
            kind, files=tgt_files, **options
        )

    # -- files ------------------------------------------------------------

    @classmethod
    def load(
        cls, path: PathLike, allow_rules: Collection[str] = (), *, pretokenizer: bool = True
    ) -> Tokenizer:
        """Read a `tokenizer.json` (attnkit's or any Hugging Face one), or a folder holding one.

        Its pretokenizer file, if any, is read too; a rule there that is not attnkit's own is
        imported only if `allow_rules` names it (`attnkit.pretokenize.rules`): a folder never
        runs code unasked. `pretokenizer=False` reads the vocabulary alone (for its ids).
        """
        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        if not path.is_file():
            raise AttnkitError(f"no tokenizer at {path}; give a tokenizer.json or its folder")
        try:
            backend = Backend.from_file(str(path))
        except Exception as err:  # the Rust side raises a bare Exception
            raise AttnkitError(
                f"{path} is not a tokenizer.json that Hugging Face tokenizers can read ({err})"
            ) from None
        if not pretokenizer:
            return cls(backend)
        return cls(backend, Pretokenizer.read(pretokenize_file(path), allow_rules))

    def save(self, path: PathLike) -> Path:
        """Write to a `.json` path, or else into that folder as `tokenizer.json`; returns the file.

        A run folder holds its tokenizer as `tokenizer.json`, so `save(run_dir)`
        and `load(run_dir)` agree.
        """
        path = Path(path)
        if path.suffix != ".json":
            path = path / TOKENIZER_FILE
        text = self.backend.to_str(pretty=True)
        if self.pretokenizer is not None:
            self.pretokenizer.save(pretokenize_file(path))
        else:  # a stale one would be read with this tokenizer
            pretokenize_file(path).unlink(missing_ok=True)
        return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))

    # -- encoding ---------------------------------------------------------

    def encode(
        self,
        text: str,
        *,
        add_bos: bool = False,
        add_eos: bool = False,
        max_length: int | None = None,
    ) -> list[int]:
        """The ids of one text; see `encode_batch`."""
        of_type("text", text, str, "encode_batch takes a list of texts")
        return self.encode_batch([text], add_bos=add_bos, add_eos=add_eos, max_length=max_length)[0]

    def encode_batch(
        self,
        texts: Sequence[str],
        *,
        add_bos: bool = False,
        add_eos: bool = False,
        max_length: int | None = None,
        padding: bool = False,
    ) -> list[list[int]]:
        """The ids of many texts, encoded in parallel by the Rust backend.

        add_bos, add_eos: put `bos_id` first and `eos_id` last.
        max_length: cut longer sequences to this many ids, the added BOS/EOS
            kept; each cut is counted in `n_truncated` and logged as a warning.
        padding: right-pad every sequence with `pad_id` to the longest.
        """
        if isinstance(texts, str):
            raise AttnkitError("texts is one string; give a list of strings, or call encode")
        of_type("texts", texts, (list, tuple), "give a list of strings")
        for number, text in enumerate(texts):
            of_type(f"texts[{number}]", text, str)
        prefix = [self.bos_id] if add_bos else []
        suffix = [self.eos_id] if add_eos else []
        room = None
        if max_length is not None:
            room = max_length - len(prefix) - len(suffix)
            if room < 1:
                raise AttnkitError(
                    f"max_length {max_length} leaves no room for text after BOS/EOS; raise it"
                )
        texts = list(texts)
        if self.pretokenizer is not None:
            texts = [self.pretokenizer.text(str(text)) for text in texts]
        try:
            encoded = self.backend.encode_batch_fast(texts, add_special_tokens=False)
        except TypeError:
            # The Rust side takes only valid Unicode strings: name the text it could not read.
            for number, text in enumerate(texts, start=1):
                check_utf8(str(text), f"text {number} of the batch")
            raise
        out = []
        truncated = 0
        for encoding in encoded:
            ids = encoding.ids
            if room is not None and len(ids) > room:
                ids = ids[:room]
                truncated += 1
            out.append(prefix + ids + suffix)
        if truncated:
            self.n_truncated += truncated
            logger.warning(
                "truncated %d of %d sequences to max_length %d", truncated, len(out), max_length
            )
        if padding:
            longest = max((len(ids) for ids in out), default=0)
            out = [ids + [self.pad_id] * (longest - len(ids)) for ids in out]
        return out

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Clean text from ids (a list or a 1-D tensor); special tokens dropped unless asked."""
        return self.decode_batch([token_ids("ids", ids)], skip_special=skip_special)[0]

    def decode_continuation(self, context: Sequence[int], ids: Sequence[int]) -> str:
        """The text `ids` add after `context` (a prompt's ids, say): decode(context + ids) less
        decode(context), so that text + continuation reads as the tokenizer decodes them together.

        Decoded alone, a continuation loses what joins it to the text before: word-level, BPE,
        WordPiece and Unigram decoders put the space between two words, not at a word's start,
        so `the cat` went on as `the cateats`. Both decodings include the context in whole, as
        a pretokenizer's restoring (`attnkit.pretokenize`) may look past the last few tokens.
        A continuation that ends inside a character (byte-level) ends in U+FFFD, as `decode`.
        """
        context = token_ids("context", context)
        ids = token_ids("ids", ids)
        if not context:
            return self.decode(ids)
        before, text = self.decode_batch([context, [*context, *ids]])
        return text[len(before) :]

    def decode_batch(self, batch: Sequence[Sequence[int]], skip_special: bool = True) -> list[str]:
        """`decode` for many sequences (a list of lists or a 2-D tensor)."""
        rows = _as_list(batch) if hasattr(batch, "tolist") else batch
        of_type("batch", rows, (list, tuple), "give a list of id lists or a 2-D tensor")
        rows = [token_ids(f"ids of row {n}", row) for n, row in enumerate(rows)]
        size = self.vocab_size
        if outside := sorted({i for row in rows for i in row if i >= size}):
            # The backend drops them without a word. A model may rightly give them (an
            # imported one whose embedding has rows past its tokenizer's), so: said, not refused.
            logger.warning(
                "ids %s are not in this vocabulary of %d tokens (0 to %d); left out of the text",
                ", ".join(map(str, outside[:5])) + (", ..." if len(outside) > 5 else ""),
                size,
                size - 1,
            )
        texts = self.backend.decode_batch(rows, skip_special_tokens=skip_special)
        if self.pretokenizer is not None:
            texts = [self.pretokenizer.restore(text) for text in texts]
        return texts

    # -- vocabulary -------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """The number of ids, special and added tokens included (the embedding's row count)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        return self._role("pad")

    @property
    def bos_id(self) -> int:
        return self._role("bos")

    @property
    def eos_id(self) -> int:
        return self._role("eos")

    @property
    def unk_id(self) -> int:
        return self._role("unk")

    @property
    def mask_id(self) -> int:
        return self._role("mask")

    @property
    def fingerprint(self) -> str:
        """A short hash of every token and its id: equal for tokenizers that give the same ids."""
        vocab: Any = sorted(self.backend.get_vocab(with_added_tokens=True).items())
        if self.pretokenizer is not None:  # the same ids of other words are other tokens
            vocab = [vocab, self.pretokenizer.to_dict()]
        return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]

    def has(self, role: str) -> bool:
        """Whether the tokenizer has a token for `role` (pad, bos, eos, unk, mask)."""
        return self._special.get(role) is not None

    def _role(self, role: str) -> int:
        found = self._special.get(role)
        if found is None:
            raise AttnkitError(
                f"this tokenizer has no {role} token (looked for {', '.join(_ROLE_NAMES[role])}); "
                f"use a tokenizer that has one, or add it with backend.add_special_tokens"
            )
        return found

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, id: int) -> str | None:
        return self.backend.id_to_token(id)

    def __repr__(self) -> str:
        model = type(self.backend.model).__name__
        return f"Tokenizer({model}, vocab_size={self.vocab_size})"


def pretokenize_file(path: Path) -> Path:
    """Where the pretokenizer of the tokenizer file `path` is saved."""
    return path.with_name(path.stem + PRETOKENIZE_SUFFIX)


def _find_special_ids(backend: Backend) -> dict[str, int | None]:
    # Special added tokens are searched first, so a plain vocabulary entry that
    # happens to be spelt `<s>` does not shadow the real one.
    special = {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    found: dict[str, int | None] = {}
    for role, names in _ROLE_NAMES.items():
        ids = [special.get(n) for n in names] + [backend.token_to_id(n) for n in names]
        found[role] = next((i for i in ids if i is not None), None)
    if found["pad"] is None and found["eos"] is not None:
        # GPT-2 style vocabularies have no padding token; padding is masked
        # anyway, so the end token serves (the usual Hugging Face practice).
        logger.info("the tokenizer has no padding token; padding with the end token")
        found["pad"] = found["eos"]
    return found


def _as_list(ids: Any) -> list:
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)
