"""The import path users know (`from attnkit.evaluate import bleu, chrf`).

The metrics live in `attnkit.evaluation.metrics`; this module re-exports its public names
(`X as X` marks each as re-exported, for linters and type checkers).
"""

from attnkit.evaluation.metrics import Score as Score
from attnkit.evaluation.metrics import bleu as bleu
from attnkit.evaluation.metrics import chrf as chrf
from attnkit.evaluation.metrics import edit_distance as edit_distance
from attnkit.evaluation.metrics import exact_match as exact_match
from attnkit.evaluation.metrics import length_ratio as length_ratio
from attnkit.evaluation.metrics import perplexity as perplexity
from attnkit.evaluation.metrics import phoneme_error_rate as phoneme_error_rate
from attnkit.evaluation.metrics import unknown_words_copied as unknown_words_copied
from attnkit.evaluation.metrics import word_error_rate as word_error_rate
