"""Training: objectives, optimizer and schedules, checkpoints, DDP, and the `Trainer` loop."""

from attnkit.train.cross_entropy import (
    LossTerms,
    label_smoothed_cross_entropy,
    linear_cross_entropy,
)
from attnkit.train.objectives import (
    LanguageModelObjective,
    MaskedLMObjective,
    Objective,
    TrainingObjective,
    TranslationObjective,
    objective_for,
)
from attnkit.train.run_config import RunConfig
from attnkit.train.trainer import Trainer, TrainResult

__all__ = [
    "LanguageModelObjective",
    "LossTerms",
    "MaskedLMObjective",
    "Objective",
    "RunConfig",
    "TrainResult",
    "Trainer",
    "TrainingObjective",
    "TranslationObjective",
    "label_smoothed_cross_entropy",
    "linear_cross_entropy",
    "objective_for",
]
