"""Scoring a run folder on a corpus split: the evaluation `attnkit eval` prints.

    translation      sources -> translate -> hypotheses: BLEU, lowercased BLEU, chrF,
                     length ratio
    language model   blocks of block_size + 1 tokens: perplexity, loss = ln(perplexity)

What is not asked for is the run's own: the [data] section it was trained with
names the corpus, the languages, the data_dir and whether text was lowercased;
without one, the model's shape picks multi30k de->en or tinyshakespeare. The
split defaults to the corpus's test split, or val where it has none. A run
trained on lowercased text reads lowercased sources; the references stay as
they are, which is why BLEU is given both cased and lowercased.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from attnkit.checks import non_negative_int
from attnkit.data import CORPORA, corpus_files, load_corpus, read_lines, split_name
from attnkit.data.batch import Batch
from attnkit.errors import AttnkitError
from attnkit.evaluate import Score, bleu, chrf, length_ratio, perplexity
from attnkit.generation import GenerationConfig
from attnkit.inference import translate
from attnkit.run import Run, load_run


@dataclass(frozen=True)
class EvalSet:
    """One corpus split read for scoring: sentence pairs for a translation model, batches of
    running text for a language model."""

    corpus: str
    split: str
    description: str
    sources: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)


@dataclass(frozen=True)
class Evaluation:
    """A run's scores on an `EvalSet`, and the translations they were computed from."""

    description: str
    scores: list[Score]
    hypotheses: list[str] = field(default_factory=list)

    def table(self) -> str:
        """The scores as `attnkit eval` prints them: metric, score, sacreBLEU signature."""
        width = max(len(score.name) for score in self.scores)
        rows = [f"{'metric':<{width}}  {'score':>8}  signature"]
        for score in self.scores:
            rows.append(
                f"{score.name:<{width}}  {score.value:>8.{score.digits}f}  {score.signature}"
            )
        return "\n".join(rows)


def read_eval_set(
    run: Run,
    *,
    corpus: str | None = None,
    split: str | None = None,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    data_dir: str | Path | None = None,
    limit: int = 0,
    block_size: int = 256,
    batch_size: int = 32,
) -> EvalSet:
    """The split to score `run` on: its first `limit` sentences (or batches) when `limit` > 0.

    A language model's text is cut into blocks of `block_size` + 1 tokens (at most the
    model's max_len), `batch_size` blocks a batch.
    """
    non_negative_int("limit", limit, zero="the whole split")
    saved = run.folder.data_defaults()
    model = run.model
    translation = model.config.shape == "encoder-decoder"
    corpus = corpus or saved.get("corpus") or ("multi30k" if translation else "tinyshakespeare")
    data_dir = data_dir or saved.get("data_dir")
    split = split_name(corpus, split)
    if translation:
        langs = (
            src_lang or saved.get("src_lang") or "de",
            tgt_lang or saved.get("tgt_lang") or "en",
        )
        src_path, ref_path = corpus_files(corpus, split, langs=langs, data_dir=data_dir)
        sources, references = list(read_lines(src_path)), list(read_lines(ref_path))
        if limit:
            sources, references = sources[:limit], references[:limit]
        if saved.get("lowercase"):
            sources = [line.lower() for line in sources]
        what = f"{corpus} {split} {langs[0]}->{langs[1]}, {len(sources)} sentences"
        return EvalSet(corpus, split, what, sources=sources, references=references)
    if corpus in CORPORA and CORPORA[corpus].langs:
        raise AttnkitError(
            f"{corpus} is a parallel corpus, but a {model.config.shape} model is scored by "
            "perplexity on running text; pass --corpus tinyshakespeare"
        )
    block = min(model.config.max_len - 1, block_size)
    dataset = load_corpus(
        corpus, split, tokenizer=run.tokenizer, data_dir=data_dir, block_size=block
    )
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=dataset.collate)
    batches = list(itertools.islice(loader, limit or None))  # collate no more than asked
    what = f"{corpus} {split}, {len(batches)} batches of {block + 1}-token blocks"
    return EvalSet(corpus, split, what, batches=batches)


def score_run(
    run: Run,
    data: EvalSet,
    generation: GenerationConfig | None = None,
    *,
    batch_size: int = 32,
    progress: Callable[[int], None] | None = None,
) -> Evaluation:
    """BLEU, lowercased BLEU and chrF of the run's translations of `data`, or a language
    model's perplexity and loss on it.

    Translations are decoded with `generation` (default: greedy, up to max_len - 1 new
    tokens), `batch_size` sentences together; `progress(n)` is told of each n done.
    """
    model = run.model
    if model.config.shape != "encoder-decoder":
        ppl = perplexity(model, data.batches)
        loss = Score("loss", math.log(ppl.value), "nats per token, ln(perplexity)", digits=4)
        return Evaluation(data.description, [ppl, loss])
    generation = generation or GenerationConfig(max_new_tokens=model.config.max_len - 1)
    hypotheses = translate(
        model, run.tokenizer, data.sources, generation, batch_size=batch_size, progress=progress
    )
    references = data.references
    scores = [
        bleu(hypotheses, references),
        bleu(hypotheses, references, lowercase=True),
        chrf(hypotheses, references),
        length_ratio(hypotheses, references),
    ]
    return Evaluation(data.description, scores, hypotheses)


def evaluate_run(
    run: Run | str | Path,
    generation: GenerationConfig | None = None,
    *,
    device: str = "cpu",
    batch_size: int = 32,
    **choices: Any,
) -> Evaluation:
    """Score a run folder (or a loaded `Run`) on a corpus split, as `attnkit eval` does.

    `choices` are `read_eval_set`'s: corpus, split, src_lang, tgt_lang, data_dir, limit,
    block_size.
    """
    if not isinstance(run, Run):
        run = load_run(run, device)
    data = read_eval_set(run, batch_size=batch_size, **choices)
    return score_run(run, data, generation, batch_size=batch_size)
