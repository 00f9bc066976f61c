"""Text to batches: readers, datasets, known corpora (Multi30k, Tiny Shakespeare, CMUdict),
token-budget batching, collation."""

from attnkit.data.batch import Batch, pad
from attnkit.data.collate import (
    collate_encoder,
    collate_lm,
    collate_translation,
    padding_efficiency,
)
from attnkit.data.corpora import (
    CORPORA,
    Corpus,
    cache_dir,
    corpus_files,
    corpus_pairs,
    group_by_source,
    load_corpus,
    split_name,
)
from attnkit.data.datasets import LanguageModelDataset, ParallelDataset, SentenceDataset
from attnkit.data.sampler import TokenBudgetSampler
from attnkit.data.text import read_aligned, read_pairs, read_parallel
from attnkit.files import read_lines

__all__ = [
    "CORPORA",
    "Batch",
    "Corpus",
    "LanguageModelDataset",
    "ParallelDataset",
    "SentenceDataset",
    "TokenBudgetSampler",
    "cache_dir",
    "collate_encoder",
    "collate_lm",
    "collate_translation",
    "corpus_files",
    "corpus_pairs",
    "group_by_source",
    "load_corpus",
    "pad",
    "padding_efficiency",
    "read_aligned",
    "read_lines",
    "read_pairs",
    "read_parallel",
    "split_name",
]
