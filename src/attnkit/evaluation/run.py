"""Scoring a run folder on a corpus split: the evaluation `attnkit eval` prints.

    translation      sources -> translate -> hypotheses: BLEU, lowercased BLEU, chrF,
                     length ratio (and the unknown words copied, when the vocabulary
                     lacks reference words that the sources have)
    G2P (cmudict)    words -> translate -> phonemes: WER and PER, any of a word's listed
                     pronunciations right (the corpus's `scores`, `error-rates`)
    language model   blocks of block_size + 1 tokens: perplexity, loss = ln(perplexity)

What is not asked for is the run's own: the [data] section it was trained with
names the corpus, the languages, the data_dir and whether text was lowercased;
without one, the model's shape picks multi30k de->en or tinyshakespeare (and a
known corpus's first two languages are the default pair). A corpus of your
own is read as training read it: a folder's `{split}.{lang}` files, a text
file cut at the run's `data.valid_fraction` into its train and val splits, a
Hugging Face dataset's splits through the run's fields (`attnkit.data.hf_datasets`),
with the rows or the text training held out where it has no split of that name. The
split defaults to the corpus's test split, or val where it has none. The
sources are read as the run reads its input (`prepare_sources`: lowercased for
a run trained on lowercased text); the references stay as they are, which is
why BLEU is given both cased and lowercased.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from attnkit.checks import non_negative_int, with_article
from attnkit.data import (
    CORPORA,
    corpus_files,
    corpus_pairs,
    group_by_source,
    hf_datasets,
    load_corpus,
    read_lines,
    split_name,
)
from attnkit.data.batch import Batch
from attnkit.data.datasets import LanguageModelDataset
from attnkit.data.section import lowered, prepare_sources
from attnkit.data.sources import folder_files, text_lines
from attnkit.errors import AttnkitError
from attnkit.evaluation.metrics import (
    Score,
    bleu,
    chrf,
    length_ratio,
    perplexity,
    phoneme_error_rate,
    unknown_words_copied,
    word_error_rate,
)
from attnkit.generation import GenerationConfig
from attnkit.inference import translate
from attnkit.run import Run, load_run


@dataclass(frozen=True)
class EvalSet:
    """One corpus split read for scoring: sentence pairs for a translation model, batches of
    running text for a language model.

    scores: `bleu`, or `error-rates` for a corpus whose sources have every accepted target
        in `reference_sets` (cmudict: a word and all its pronunciations); `references`
        then holds the first of each.
    inputs: the corpus files it was read from (and, for a folder, the plain name that would
        be read in place of a gzipped one), each with its name for the user: what an output
        must not be written over (`attnkit.files.check_writable`).
    """

    corpus: str
    split: str
    description: str
    sources: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    reference_sets: list[tuple[str, ...]] = field(default_factory=list)
    scores: str = "bleu"
    inputs: tuple[tuple[str, Path], ...] = ()


@dataclass(frozen=True)
class Evaluation:
    """A run's scores on an `EvalSet`, and the translations they were computed from."""

    description: str
    scores: list[Score]
    hypotheses: list[str] = field(default_factory=list)

    def table(self) -> str:
        """The scores as `attnkit eval` prints them: metric, score, sacreBLEU signature."""
        width = max(len("metric"), *(len(score.name) for score in self.scores))
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
    """The split to score `run` on: its first `limit` sentences, words (or batches) when
    `limit` > 0.

    A language model's text is cut into blocks of `block_size` + 1 tokens (at most the
    model's max_len), `batch_size` blocks a batch.
    """
    non_negative_int("limit", limit, zero="the whole split")
    saved = run.folder.data_defaults()
    model = run.model
    translation = model.config.shape == "encoder-decoder"
    if saved.get("task") == "reverse" and corpus is None:
        raise AttnkitError(
            f"{run.folder.root} was trained on the reverse demo's random digit strings, which "
            "`attnkit demo` scores (exact match); to score it on a corpus, pass --corpus"
        )
    if saved.get("task") == "span-corruption":
        raise AttnkitError(
            f"{run.folder.root} is pre-trained by span corruption, which restores dropped spans "
            "rather than translating (its training logged the validation loss of that); "
            "fine-tune it for a task with train.init_from and score the fine-tuned run"
        )
    if saved.get("task") in ("preference", "ppo") and corpus is None:
        raise AttnkitError(
            f"{run.folder.root} was tuned on preference pairs, whose rewards its training "
            "measured (metrics.jsonl); to score it on a corpus, pass --corpus"
        )
    corpus = corpus or saved.get("corpus") or ("multi30k" if translation else "tinyshakespeare")
    data_dir = data_dir or saved.get("data_dir")
    known = CORPORA.get(corpus)
    # Read as training read it: the run's [data] section with the corpus asked for.
    section = dataclasses.replace(run.data, corpus=corpus)
    dataset = known is None and hf_datasets.is_dataset(section)
    own_text = known is None and (dataset or Path(corpus).is_file())  # a model's own text
    split = split_name(corpus, split or ("val" if own_text and not translation else None))
    if translation and known is not None and known.pairs is not None:
        return _grouped_set(run, corpus, split, (src_lang, tgt_lang), limit)
    if translation:
        langs = (
            src_lang or saved.get("src_lang") or "de",
            tgt_lang or saved.get("tgt_lang") or "en",
        )
        if langs[0] == langs[1]:
            raise AttnkitError(
                f"the source and target languages are both {langs[0]!r}; a translation is "
                "scored from one language into another: give --src-lang and --tgt-lang"
            )
        inputs: tuple[tuple[str, Path], ...] = ()
        if dataset:
            sources, references = hf_datasets.split_text(section, split, langs)
        else:
            src_path, ref_path = (
                corpus_files(corpus, split, langs=langs, data_dir=data_dir)
                if known is not None
                else folder_files(corpus, split, langs)
            )
            sources, references = list(read_lines(src_path)), list(read_lines(ref_path))
            inputs = _corpus_inputs(
                {"the sources": src_path, "the references": ref_path}, corpus, known is None
            )
        if limit:
            sources, references = sources[:limit], references[:limit]
        sources = prepare_sources(run.data, sources)
        what = f"{corpus} {split} {langs[0]}->{langs[1]}, {len(sources)} sentences"
        return EvalSet(corpus, split, what, sources=sources, references=references, inputs=inputs)
    if corpus in CORPORA and CORPORA[corpus].langs:
        raise AttnkitError(
            f"{corpus} is a parallel corpus, but {with_article(model.config.shape)} model is "
            "scored by perplexity on running text; pass --corpus tinyshakespeare"
        )
    block = min(model.config.max_len - 1, block_size)
    if own_text:  # cut at the fraction training held out, so val is the text it validated on
        blocks = LanguageModelDataset.from_lines(
            text_lines(section, keepends=True),
            tokenizer=run.tokenizer,
            block_size=block,
            split=split,
            val_fraction=section.valid_fraction,
            name=corpus,
            option_names=("--block-size", "data.valid_fraction"),
        )
    else:
        blocks = load_corpus(
            corpus, split, tokenizer=run.tokenizer, data_dir=data_dir, block_size=block
        )
    loader = DataLoader(blocks, batch_size=batch_size, collate_fn=blocks.collate)
    batches = list(itertools.islice(loader, limit or None))  # collate no more than asked
    what = f"{corpus} {split}, {len(batches)} batches of {block + 1}-token blocks"
    return EvalSet(corpus, split, what, batches=batches)


def _corpus_inputs(
    read: dict[str, Path], corpus: str, folder: bool
) -> tuple[tuple[str, Path], ...]:
    """The files `read` (each named by its role) as inputs no output may replace; for a
    folder corpus, a gzipped file's plain name too, which `folder_files` would read first."""
    inputs = []
    for role, path in read.items():
        inputs.append((f"{role} of {corpus}, {path}", path))
        if folder and path.suffix == ".gz":
            plain = path.with_suffix("")
            inputs.append((f"{role} of {corpus}, read in place of {path.name}", plain))
    return tuple(inputs)


def _grouped_set(
    run: Run,
    corpus: str,
    split: str,
    asked: tuple[str | None, str | None],
    limit: int,
) -> EvalSet:
    """A corpus held in memory (cmudict) as sources, each with every target it accepts;
    `asked` are the languages given (None: the run's)."""
    default, saved = CORPORA[corpus].langs, run.folder.data_defaults()
    langs = (
        asked[0] or saved.get("src_lang") or default[0],
        asked[1] or saved.get("tgt_lang") or default[1],
    )
    sources, reference_sets = group_by_source(corpus_pairs(corpus, split, langs))
    if limit:
        sources, reference_sets = sources[:limit], reference_sets[:limit]
    sources = prepare_sources(run.data, sources)
    n_refs = sum(map(len, reference_sets))
    what = f"{corpus} {split} {langs[0]}->{langs[1]}, {len(sources)} sources, {n_refs} references"
    return EvalSet(
        corpus,
        split,
        what,
        sources=sources,
        references=[refs[0] for refs in reference_sets],
        reference_sets=reference_sets,
        scores=CORPORA[corpus].scores,
    )


def score_run(
    run: Run,
    data: EvalSet,
    generation: GenerationConfig | None = None,
    *,
    batch_size: int = 32,
    progress: Callable[[int], None] | None = None,
) -> Evaluation:
    """BLEU, lowercased BLEU and chrF of the run's translations of `data` (WER and PER for a
    set scored by error rates), or a language model's perplexity and loss on it.

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
    if data.scores == "error-rates":
        scores = [
            word_error_rate(hypotheses, data.reference_sets),
            phoneme_error_rate(hypotheses, data.reference_sets),
        ]
        return Evaluation(data.description, scores, hypotheses)
    references = data.references
    scores = [
        bleu(hypotheses, references),
        bleu(hypotheses, references, lowercase=True),
        chrf(hypotheses, references),
        length_ratio(hypotheses, references),
    ]
    # Over a word vocabulary some reference words are unknown, and only copying writes them;
    # a run trained on lowercased text is asked for them lowercased.
    wanted = lowered(run.data, references)
    copied = unknown_words_copied(data.sources, wanted, hypotheses, run.tokenizer)
    scores += [] if copied is None else [copied]
    return Evaluation(data.description, scores, hypotheses)


def evaluate_run(
    run: Run | str | Path,
    generation: GenerationConfig | None = None,
    *,
    device: str = "cpu",
    compute_type: str = "float32",
    batch_size: int = 32,
    **choices: Any,
) -> Evaluation:
    """Score a run folder (or a loaded `Run`) on a corpus split, as `attnkit eval` does.

    `choices` are `read_eval_set`'s: corpus, split, src_lang, tgt_lang, data_dir, limit,
    block_size. `device` and `compute_type` (float32, int8, bf16, auto) load a folder.
    """
    if not isinstance(run, Run):
        run = load_run(run, device, compute_type=compute_type)
    data = read_eval_set(run, batch_size=batch_size, **choices)
    return score_run(run, data, generation, batch_size=batch_size)
