"""A run's `[data]` section, and the one preparation of the text a run's model reads.

    source text  ->  lowercased (data.lowercase)  ->  in the corpus's own form (cmudict: letters)

A model learns from text in one form and must be given text in that form:
lowercased when it trained on lowercased text, and, for a corpus whose sources
are written another way than a user types them, in that way (a G2P model
trained on CMUdict reads a word as its letters, `h e l l o`, not `hello`).
`prepare_sources` is that preparation, and every way text reaches a trained
run goes through it: `attnkit translate`, `attnkit eval`, `attnkit serve`'s
`/v1/translate` and the Python API (`attnkit.inference.translate_run`).
Training reads its corpus lowercased by the same rule (`lowered`); the
corpus's own form is what the corpus already holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from attnkit.checks import check, choice, each, finite_fields, non_negative, positive, within
from attnkit.data.corpora import CORPORA
from attnkit.data.datasets import WINDOWS
from attnkit.tokenizer import KINDS as TOKENIZER_KINDS

# The choices of `data.task`; `attnkit.train.tasks` has a runner for each.
TASKS = (
    "translation",
    "language-model",
    "masked-lm",
    "span-corruption",
    "reverse",
    "preference",
    "reward-model",
    "ppo",
    "sampled-pairs",
    "sentence-embedding",
    "word2vec",
    "glove",
)
VECTOR_TASKS = ("word2vec", "glove")  # word vectors, no Transformer: `train/vector_runs.py`


@dataclass(frozen=True)
class DataSection:
    """What to learn from and how to batch it.

    task: `translation` (encoder-decoder), `language-model` (decoder),
        `masked-lm` (encoder), `span-corruption` (encoder-decoder: T5's pre-training),
        `reverse` (the built-in digit-reversal demo), `preference` (DPO on preference pairs,
        fine-tuning `train.init_from`: a decoder or an encoder-decoder), `reward-model` (a
        scalar head on `train.init_from`'s model, trained on preference pairs), `ppo` (PPO
        against `ppo.reward_model`), `sampled-pairs` (preference pairs from a translation
        run's samples, ranked by sentence BLEU), `sentence-embedding` (an encoder's sentence
        vectors, trained so a sentence meets its translation: `[embedding]`), `word2vec` or
        `glove` (word vectors, no Transformer).
    corpus: a known corpus (`multi30k`, `tinyshakespeare`), a path to text or a local Hugging
        Face dataset (`attnkit.data.hf_datasets`), for `preference`, `reward-model` and `ppo` a
        folder of `{split}.jsonl` pairs (`attnkit.data.preference`); no default, so that no run
        learns from a corpus its config does not name.
    data_dir: a folder holding known corpora as `<corpus>/<file>`, searched before
        `$ATTNKIT_DATA` and the download cache (`attnkit.data.corpora`); unset, only those.
    src_lang, tgt_lang: the languages (file suffixes, or a dataset's columns) of a
        translation's source and target; a word2vec run reads both sides' text.
    train_split, valid_split: the corpus splits trained on and validated on.
    valid_fraction: the share at the end of a one-file text held out for validation (a
        language model's or masked LM's corpus).
    tokenizer, vocab_size: the kind of tokenizer trained on the training text, and its
        vocabulary's size (a `char` vocabulary is as large as the text needs).
    source_field, target_field, text_field: a dataset's columns of source, target and running
        text; unset, the ones named like the languages or `translation`, and `text`.
    lowercase: learn from lowercased text; a trained run's input is then lowercased too
        (`prepare_sources`: `attnkit translate`, `eval`, `serve` and the Python API).
    max_len: the longest example kept, in tokens a side; longer ones are skipped and counted.
    max_tokens: the token budget of one batch for sentence tasks (for preference pairs, of
        each side: the prompts, the chosen rows, the rejected rows).
    batch_size: sequences per batch for the language model and the demo; prompts per rollout
        for `ppo`; sources decoded together for `sampled-pairs`.
    block_size: tokens of context per language-model example.
    windows: where a language model's training examples lie in the text each epoch
        (as many as the text has blocks): `random`, each at a fresh random offset, as
        nanoGPT draws them; `shifted`, the block grid moved by one random offset per
        epoch; `blocks`, the same blocks every epoch. Validation always reads fixed blocks.
    mask_prob: share of tokens the masked-LM objective hides (BERT: 0.15).
    noise_density: share of each sentence's tokens span corruption drops (T5: 0.15).
    mean_span_length: the mean length of span corruption's dropped spans (T5: 3).
    num_workers: processes that prepare batches beside training (torch's DataLoader).
    """

    task: str = "translation"
    corpus: str = ""
    data_dir: str = ""
    src_lang: str = "de"
    tgt_lang: str = "en"
    source_field: str = ""
    target_field: str = ""
    text_field: str = ""
    train_split: str = "train"
    valid_split: str = "val"
    valid_fraction: float = 0.1
    tokenizer: str = "bpe"
    vocab_size: int = 8000
    lowercase: bool = False
    max_len: int = 128
    max_tokens: int = 4096
    batch_size: int = 64
    block_size: int = 128
    windows: str = "random"
    mask_prob: float = 0.15
    noise_density: float = 0.15
    mean_span_length: float = 3.0
    num_workers: int = 0

    def __post_init__(self) -> None:
        finite_fields(self, "data")
        choice("data.task", self.task, TASKS)
        choice("data.tokenizer", self.tokenizer, TOKENIZER_KINDS)
        choice("data.windows", self.windows, WINDOWS)
        each(positive, "data", self, "vocab_size", "max_len", "max_tokens")
        each(positive, "data", self, "batch_size", "block_size")
        each(non_negative, "data", self, "num_workers")
        within("data.valid_fraction", self.valid_fraction, "(0, 1)")
        within("data.mask_prob", self.mask_prob, "(0, 1)")
        within("data.noise_density", self.noise_density, "(0, 1)")
        check(
            self.mean_span_length >= 1,
            f"data.mean_span_length must be at least 1 (token), got {self.mean_span_length}",
        )
        check(self.src_lang != self.tgt_lang, "data.src_lang and data.tgt_lang must differ")


def lowered(data: DataSection, lines: Iterable[str]) -> list[str]:
    """`lines` lowercased if the run learns from lowercased text (`data.lowercase`)."""
    return [line.lower() for line in lines] if data.lowercase else list(lines)


def prepare_sources(data: DataSection, texts: Iterable[str]) -> list[str]:
    """The texts as the run of `data` reads its sources: lowercased if it learned from
    lowercased text, then in its corpus's own form (`Corpus.as_source`: a CMUdict run
    reads a word as its letters). A text already in that form stays as it is, so the
    corpus's own sources pass unchanged."""
    texts = lowered(data, texts)
    known = CORPORA.get(data.corpus)
    if known is None or known.as_source is None:
        return texts
    return [known.as_source(text) for text in texts]
