"""Validation metrics on greedy decodes: what `eval.metric` can name beyond the loss.

    bleu       corpus BLEU (sacreBLEU, 13a) of greedy translations, one reference each
    per, wer   phoneme and word error rates (`attnkit.evaluation.metrics`) of greedy outputs, any of
               a source's references right: grapheme-to-phoneme conversion, where a word
               has several listed pronunciations

Each is a `Metric`: the model in, named values out, computed on rank 0 at every
evaluation. BLEU is better higher, the error rates lower (`EvalSection.lower_is_better`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from attnkit.data.corpora import group_by_source
from attnkit.evaluation.metrics import bleu, phoneme_error_rate, word_error_rate
from attnkit.generation import GenerationConfig
from attnkit.models import TransformerModel
from attnkit.tokenizer import Tokenizer
from attnkit.train.metrics import Metric

# The names `error_rate_metric` reports, either of which `eval.metric` may pick.
ERROR_RATES = ("per", "wer")


def _decoder(
    tokenizer: Tokenizer, sources: Sequence[str], max_new_tokens: int, batch_size: int
) -> Callable[[TransformerModel], list[str]]:
    """The model's greedy outputs for `sources`, detokenized."""
    from attnkit.inference import translate

    generation = GenerationConfig(max_new_tokens=max_new_tokens)
    return lambda model: translate(model, tokenizer, sources, generation, batch_size=batch_size)


def bleu_metric(
    tokenizer: Tokenizer,
    sources: Sequence[str],
    references: Sequence[str],
    *,
    max_new_tokens: int = 128,
    batch_size: int = 64,
) -> Metric:
    """Corpus BLEU (sacreBLEU) of greedy translations of `sources`, as a validation metric."""
    decode = _decoder(tokenizer, sources, max_new_tokens, batch_size)

    def metric(model: TransformerModel) -> dict[str, float]:
        return {"bleu": bleu(decode(model), references).value}

    return metric


def error_rate_metric(
    tokenizer: Tokenizer,
    sources: Sequence[str],
    reference_sets: Sequence[Sequence[str]],
    *,
    max_new_tokens: int = 128,
    batch_size: int = 64,
) -> Metric:
    """PER and WER of greedy outputs for `sources`, each right if it is any of its
    `reference_sets`, as a validation metric."""
    decode = _decoder(tokenizer, sources, max_new_tokens, batch_size)

    def metric(model: TransformerModel) -> dict[str, float]:
        hypotheses = decode(model)
        return {
            "per": phoneme_error_rate(hypotheses, reference_sets).value,
            "wer": word_error_rate(hypotheses, reference_sets).value,
        }

    return metric


def translation_metric(
    tokenizer: Tokenizer,
    sources: Sequence[str],
    targets: Sequence[str],
    n: int,
    *,
    error_rates: bool,
    max_new_tokens: int,
) -> Metric:
    """The validation metric of a translation task over its first `n` sources: BLEU, or with
    `error_rates` WER and PER, any target listed for a source right (a word's pronunciations)."""
    if not error_rates:
        return bleu_metric(tokenizer, sources[:n], targets[:n], max_new_tokens=max_new_tokens)
    distinct, reference_sets = group_by_source(zip(sources, targets, strict=True))
    return error_rate_metric(
        tokenizer, distinct[:n], reference_sets[:n], max_new_tokens=max_new_tokens
    )
