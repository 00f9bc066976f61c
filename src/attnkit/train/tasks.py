"""From a run config to what the `Trainer` needs: model, data, objective and metrics.

Each task of `data.task` pairs a model shape with an objective and a data
pipeline: `translation` (encoder-decoder, parallel text, BLEU), `language-model`
(decoder, blocks of text), `masked-lm` (encoder, sentences) and `reverse`
(the built-in demo).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from attnkit.data.batch import Batch
from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel
from attnkit.train.run_config import RunConfig
from attnkit.train.trainer import Metric


@dataclass
class TaskSetup:
    model: TransformerModel
    train_data: Iterable[Batch]
    val_data: Iterable[Batch] | None
    metrics: Sequence[Metric]
    tokenizer: Any


def build_task(config: RunConfig) -> TaskSetup:
    """The model, data and metrics that `config.data.task` names."""
    if config.data.task == "reverse":
        from attnkit.demo import reverse_setup

        return reverse_setup(config)
    raise AttnkitError(f"data.task {config.data.task!r} is not available in this build")
