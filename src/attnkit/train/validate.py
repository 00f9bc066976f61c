"""A run config checked as a whole, before any work starts.

Each section checks its own keys as it is read (`attnkit.train.run_config`). The
rules here span sections or look at the disk: the task's corpus, metric and model
shape, the context a language model's blocks need, and the run folder the run
will write. `attnkit train` and `train(config)` call `validate` first, so that a
mistake stops in one sentence before the tokenizer is trained, not at the first
evaluation hundreds of steps in.
"""

from __future__ import annotations

from pathlib import Path

from attnkit.checks import check, with_article
from attnkit.config import ModelConfig
from attnkit.data import CORPORA
from attnkit.data.hf_datasets import is_dataset
from attnkit.data.reverse import BOS, EOS, VOCAB
from attnkit.data.section import VECTOR_TASKS
from attnkit.devices import resolve_device
from attnkit.files import nearest_folder
from attnkit.run import RunFolder
from attnkit.tokenizer_training import PHRASE_KINDS
from attnkit.train.loggers import check_installed
from attnkit.train.run_config import RunConfig

# The model shapes each task trains.
SHAPES_OF_TASK = {
    "translation": ("encoder-decoder",),
    "language-model": ("decoder",),
    "masked-lm": ("encoder",),
    "span-corruption": ("encoder-decoder",),
    "reverse": ("encoder-decoder",),
    "preference": ("decoder", "encoder-decoder"),
    "reward-model": ("decoder", "encoder-decoder"),
    "ppo": ("decoder", "encoder-decoder"),
    "sampled-pairs": ("encoder-decoder",),
    "sentence-embedding": ("encoder",),
}
# What each task's evaluation measures: the validation loss and perplexity where it has
# validation data, and the names its own metric returns (`attnkit.train.tasks`).
METRICS_OF_TASK = {
    "translation": ("val_loss", "val_ppl", "bleu", "per", "wer"),
    "language-model": ("val_loss", "val_ppl"),
    "masked-lm": ("val_loss", "val_ppl"),
    "span-corruption": ("val_loss", "val_ppl"),
    "reverse": ("exact_match",),
    "preference": ("val_loss", "reward_margin", "reward_accuracy"),
    "reward-model": ("val_loss", "reward_margin", "reward_accuracy"),
    "ppo": ("val_reward",),
    "sampled-pairs": ("val_loss",),  # it measures nothing; its default stands
    "sentence-embedding": ("val_loss", "retrieval_accuracy"),
}
# The tasks that start from a trained run and read a folder of {split}.jsonl pairs.
PAIRS_TASKS = ("preference", "reward-model", "ppo")


def validate(config: RunConfig) -> None:
    """Stop with one sentence if `config` cannot train: its data, metric, model and run folder."""
    d, task = config.data, config.data.task
    if task == "reverse":
        check(
            not config.train.init_from,
            "the reverse demo trains from scratch; unset train.init_from",
        )
    elif task in PAIRS_TASKS:
        check(
            bool(config.train.init_from),
            f"data.task {task!r} fine-tunes a trained run (against itself, frozen, for "
            "preference and ppo); set train.init_from to that run's folder",
        )
        check(
            bool(d.corpus),
            f"data.task {task!r} reads its pairs from a folder of {{split}}.jsonl files; set "
            "data.corpus to that folder",
        )
        check(
            task != "ppo" or bool(config.ppo.reward_model),
            "data.task 'ppo' scores its samples with a reward model; set ppo.reward_model to "
            "the folder of a reward-model run",
        )
    elif task == "sampled-pairs":
        check(
            bool(config.train.init_from) and bool(d.corpus),
            "data.task 'sampled-pairs' samples translations of a trained run; set "
            "train.init_from to that run's folder and data.corpus to a translation corpus",
        )
    else:
        check(
            bool(d.corpus),
            f"data.task {task!r} learns from text, but data.corpus is not set; set it to a "
            f"known corpus ({', '.join(CORPORA)}) or to the path of your text",
        )
        fields = [
            f"data.{f}" for f in ("source_field", "target_field", "text_field") if getattr(d, f)
        ]
        check(
            not fields or is_dataset(d),
            f"{', '.join(fields)} name columns of a dataset, but data.corpus {d.corpus!r} is "
            "not a dataset that attnkit.data.hf_datasets reads; unset them or give a dataset",
        )
    check(
        task not in VECTOR_TASKS or not config.train.log_to,
        f"train.log_to sends the Trainer's records on, but a {task} run trains without it; "
        "unset train.log_to (its metrics.jsonl and curves.png are written as always)",
    )
    check_installed(config.train.log_to)
    resolve_device(config.train.device)  # a device this machine lacks, before any work
    _check_pretokenize(config)
    if task in VECTOR_TASKS:  # no Transformer, no validation: its [word2vec] or [glove] is all
        check_out_dir(config.train.out_dir)
        return
    metrics = METRICS_OF_TASK[task]
    corpus = CORPORA.get(config.data.corpus)
    if task == "translation" and corpus is not None and corpus.scores == "error-rates":
        metrics = tuple(m for m in metrics if m != "bleu")  # G2P is scored by PER and WER
    check(
        config.eval.metric in metrics,
        f"eval.metric {config.eval.metric!r} is not computed for data.task {task!r}; "
        f"choose one of {', '.join(metrics)}",
    )
    check(
        not (config.train.init_embeddings and config.train.init_from),
        "train.init_embeddings starts a new model's embeddings, but train.init_from's model "
        "is trained already; unset one of them",
    )
    vectors = Path(config.train.init_embeddings)
    check(
        not config.train.init_embeddings
        or vectors.is_file()
        or RunFolder(vectors).vectors.is_file(),
        f"train.init_embeddings {str(vectors)!r} is neither a vector file nor a word2vec or "
        "GloVe run folder holding vectors.bin",
    )
    _check_beyond_teacher_forcing(config)
    _check_guided_attention(config)
    _check_model(config)
    check_out_dir(config.train.out_dir)


def _check_pretokenize(config: RunConfig) -> None:
    """The [pretokenize] options that make sense for the task and the tokenizer."""
    p, task = config.pretokenize, config.data.task
    if not p.on or task in VECTOR_TASKS:
        return
    check(
        task != "reverse",
        "the reverse demo has a fixed vocabulary of digits; unset the [pretokenize] options",
    )
    check(
        not p.lossy,
        f"{' and '.join(p.lossy)} drop or change words for good, which only word vectors may "
        f"do (data.task word2vec or glove); unset them for data.task {task!r}",
    )
    if p.phrases:
        check(
            config.data.tokenizer in PHRASE_KINDS,
            f"a {config.data.tokenizer} tokenizer splits phrases again at their delimiter; set "
            f"data.tokenizer to one of {', '.join(PHRASE_KINDS)}, or unset pretokenize.phrases",
        )
    check(
        not config.train.init_from,
        "train.init_from's tokenizer is used as it is; unset the [pretokenize] options",
    )


def _check_beyond_teacher_forcing(config: RunConfig) -> None:
    """Scheduled sampling and sequence-level losses train a decoder on its own outputs: a
    translation or language model, one of the two at a time."""
    task = config.data.task
    for section in ("scheduled_sampling", "sequence_loss"):
        check(
            not getattr(config, section).on or task in ("translation", "language-model"),
            f"[{section}] trains a decoder on its own outputs, which data.task {task!r} has "
            "not; use it with translation or language-model",
        )
    sampling = config.scheduled_sampling
    check(
        not (sampling.on and sampling.mix == "softmax" and config.train.compile),
        "scheduled_sampling.mix 'softmax' swaps the decoder's embeddings in for one pass, "
        "which a compiled model does not see; set train.compile = false or mix = 'argmax'",
    )
    check(
        not (sampling.on and config.sequence_loss.on),
        "[scheduled_sampling] and [sequence_loss] do not combine; train with one, then "
        "fine-tune with the other (train.init_from)",
    )


def _check_guided_attention(config: RunConfig) -> None:
    """Guided attention shapes a translation model's cross-attention under teacher forcing."""
    if not config.guided_attention.on:
        return
    task = config.data.task
    check(
        task == "translation",
        f"[guided_attention] guides the cross-attention of a translation model, which "
        f"data.task {task!r} does not train; use it with data.task 'translation' or set "
        "guided_attention.weight = 0",
    )
    for section in ("scheduled_sampling", "sequence_loss"):
        check(
            not getattr(config, section).on,
            f"[guided_attention] and [{section}] do not combine; train with guided attention, "
            "then fine-tune with the other (train.init_from)",
        )


def _check_model(config: RunConfig) -> None:
    """The model the run will train must have the task's shape and, for a language model,
    room for a block of context."""
    task, init_from = config.data.task, config.train.init_from
    if init_from:
        folder = RunFolder(init_from)
        check(
            folder.config.is_file(),
            f"train.init_from {init_from!r} is not an attnkit run folder: "
            f"{folder.config.name} is missing; fine-tune a folder made by attnkit train "
            "or attnkit import hf",
        )
        model = ModelConfig.from_json(folder.config)
        where, fix = f"train.init_from {init_from!r} holds", "fine-tune a run of that shape"
    else:
        # The vocabulary comes from the tokenizer, trained later; the size asked of it
        # stands in, so that every other field of [model] is checked now.
        ids = {"vocab_size": config.data.vocab_size}
        if task == "reverse":
            ids = {"vocab_size": len(VOCAB), "eos_id": EOS, "decoder_start_id": BOS}
        model = config.model.build(**ids)
        where, fix = "the [model] section describes", "set model.shape or choose another preset"
    shapes = SHAPES_OF_TASK[task]
    check(
        model.shape in shapes,
        f"data.task {task!r} trains {' or '.join(map(with_article, shapes))} model, but "
        f"{where} {with_article(model.shape)} one; {fix}",
    )
    check(
        task not in PAIRS_TASKS or model.copy_attention == "none",
        f"data.task {task!r} scores responses through the plain output layer, which a "
        "pointer-generator (model.copy_attention) replaces; fine-tune a run without one",
    )
    guided = config.guided_attention
    if guided.on:
        # Each raises its one sentence if an index is out of the model's range.
        guided.layer_indices(model.n_decoder_layers)
        guided.head_indices(model.n_heads)
        check(
            model.copy_attention == "none",
            "[guided_attention] trains through the plain output layer, which a "
            "pointer-generator (model.copy_attention) replaces; set model.copy_attention = "
            "'none' or guided_attention.weight = 0",
        )
    for section in ("scheduled_sampling", "sequence_loss"):
        check(
            model.copy_attention == "none" or not getattr(config, section).on,
            f"[{section}] feeds the decoder through the plain output layer, which a "
            "pointer-generator (model.copy_attention) replaces; train the pointer with teacher "
            "forcing",
        )
    block_size = config.data.block_size
    check(
        task != "language-model" or block_size <= model.max_len,
        f"data.block_size {block_size} is over model.max_len {model.max_len}; "
        "lower the one or raise the other",
    )


def check_out_dir(out_dir: str | Path) -> None:
    """`out_dir` must be a folder that can be made and written to; nothing is created."""
    path = Path(out_dir)
    check(
        path.is_dir() or not path.exists(),
        f"train.out_dir {str(out_dir)!r} is a file, not a folder; choose another train.out_dir",
    )
    nearest, writable = nearest_folder(path)
    check(
        nearest.is_dir(),
        f"train.out_dir {str(out_dir)!r} cannot be made, because {str(nearest)!r} is a file; "
        "choose another train.out_dir",
    )
    check(
        writable,
        f"train.out_dir {str(out_dir)!r} cannot be written, because {str(nearest)!r} is "
        "not writable; choose a train.out_dir in a folder you can write to",
    )
