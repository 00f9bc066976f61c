"""A Transformer run's model: new from the [model] section, or another run's to fine-tune.

With `train.init_from` the model (config and weights) is that run's, of the
task's shape (`attnkit.train.validate` checked it); otherwise a preset and the
[model] fields, sized to the run's tokenizer, with its decoding ids, the
weights drawn from `train.seed` (or left on the meta device with `train.init_on_meta`,
for the Trainer to draw after sharding) and, with `train.init_embeddings`, the token
embeddings started from word vectors. Either way the [lora] or [adapters]
section then freezes it under LoRA updates or Houlsby adapters
(`attnkit.train.fine_tuning`), before the task makes its objective: DPO's
reference is the model with its LoRA update switched off.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from attnkit.embeddings.pretrained import init_embeddings
from attnkit.embeddings.vectors import load_vectors
from attnkit.models import TransformerModel, build_model
from attnkit.run import RunFolder, load_pretrained, with_decoding_ids
from attnkit.tokenizer import Tokenizer
from attnkit.train.fine_tuning import fine_tune
from attnkit.train.meta_init import on_meta
from attnkit.train.run_config import RunConfig

log = logging.getLogger(__name__)


def run_model(config: RunConfig, tokenizer: Tokenizer, **resolved: Any) -> TransformerModel:
    """The model the run trains, fine-tuned as [lora] and [adapters] ask; `resolved` are
    `ModelConfig` fields the data dictates."""
    model = _base_model(config, tokenizer, **resolved)
    fine_tune(model, config.lora, config.adapters, config.train.seed)
    return model


def _base_model(config: RunConfig, tokenizer: Tokenizer, **resolved: Any) -> TransformerModel:
    if config.train.init_from:
        if config.model.preset or config.model.overrides:
            log.warning("the [model] section is not used: the model is train.init_from's")
        # A base run saved before models recorded their decoding ids takes them from its
        # tokenizer, the one this run trains with (`load_pretrained`), so this run records them.
        return load_pretrained(config.train.init_from, tokenizer=tokenizer).train()
    model_config = config.model.build(vocab_size=tokenizer.vocab_size, **resolved)
    model_config = with_decoding_ids(model_config, tokenizer)
    torch.manual_seed(config.train.seed)
    if config.train.init_on_meta:  # the Trainer shards it, then draws the weights
        return on_meta(model_config)
    model = build_model(model_config)
    if config.train.init_embeddings:
        vectors = load_vectors(_vector_file(config.train.init_embeddings))
        coverage = init_embeddings(model, tokenizer, vectors)
        log.info("train.init_embeddings: %s", coverage.describe())
    return model


def _vector_file(path: str) -> Path:
    """A vector file, or the vectors.bin of a word2vec or GloVe run folder."""
    return RunFolder(path).vectors if Path(path).is_dir() else Path(path)
