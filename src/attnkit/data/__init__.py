"""Text to batches: datasets, known corpora, token-budget batching."""

from attnkit.data.batch import Batch, pad

__all__ = ["Batch", "pad"]
