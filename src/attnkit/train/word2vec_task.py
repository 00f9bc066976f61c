"""The word2vec task of `attnkit train`: word vectors learned from a corpus, into a run folder.

    [data]      task = "word2vec", corpus (a known corpus, a folder of {split}.{lang}, a file),
                lowercase
    [word2vec]  architecture, dim, window, negative, sample, min_count, epochs, alpha, ...
    [train]     out_dir, seed, threads (0: torch's), max_minutes

The text becomes sentences of words, one a line (`split_words`: runs of letters
and digits, an apostrophe inside a word kept, punctuation dropped); a parallel
corpus gives the lines of both languages of `data.train_split`, so that both
share one space, as they share one vocabulary in translation. Training goes in
steps of about 100,000 words (`CHUNK_WORDS`): each step appends its mean loss,
rate and words a second to metrics.jsonl and moves the progress bar; the vectors
are saved (trainer_state.pt) at the end of each epoch and when the run stops
(Ctrl-C, SIGTERM, `train.max_minutes`), and `--resume` continues from there,
each step with its own seed, so that one thread resumes to the same vectors.
At the end the folder holds `vectors.bin` (word2vec's binary format) and, where
gensim's benchmark files are found, the vectors' WordSim-353 and SimLex-999
Spearman correlations and Google analogy accuracy in metrics.jsonl.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from attnkit.data import CORPORA
from attnkit.data.hf_datasets import is_dataset
from attnkit.data.section import DataSection, lowered
from attnkit.data.sources import corpus_text, text_lines
from attnkit.embeddings import evaluation
from attnkit.embeddings.vectors import save_vectors
from attnkit.embeddings.word2vec import Progress, Word2Vec, count_words
from attnkit.errors import AttnkitError
from attnkit.files import atomic_write
from attnkit.run import RunFolder
from attnkit.train import checkpoint as ckpt
from attnkit.train import lock
from attnkit.train.run_config import RunConfig
from attnkit.train.stopping import Stopping, TrainResult
from attnkit.train.validate import validate
from attnkit.viz import plot_curves

log = logging.getLogger(__name__)

CHUNK_WORDS = 100_000
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")


def split_words(line: str) -> list[str]:
    """The words of a line: runs of letters and digits, "don't" one word, punctuation dropped."""
    return _WORD.findall(line)


def sentences(data: DataSection) -> list[list[str]]:
    """The training text of `data` as sentences of words, empty lines left out."""
    known = CORPORA.get(data.corpus)
    if known is not None and known.pairs is not None:
        raise AttnkitError(
            f"word2vec learns from running text, which {data.corpus} is not; use "
            "multi30k, tinyshakespeare or a text file as data.corpus"
        )
    folder = known is None and Path(data.corpus).is_dir() and not is_dataset(data)
    if (known is not None and known.langs) or folder:
        langs = (data.src_lang, data.tgt_lang)
        lines = [line for side in corpus_text(data, data.train_split, langs) for line in side]
    else:
        lines = list(text_lines(data))
        lines = lowered(data, lines)
    return [words for line in lines if (words := split_words(line))]


def train(
    config: RunConfig,
    *,
    resume: bool = False,
    callbacks: Sequence[Callable[[dict[str, Any]], None]] = (),
    resume_command: str = "attnkit.train.tasks.train(config, resume=True)",
) -> TrainResult:
    """Learn the vectors `config` describes in the run folder `train.out_dir`."""
    validate(config)
    folder = RunFolder(config.train.out_dir)
    lock.check_free(folder)
    if not resume:
        ckpt.check_new_run(folder)
    text = sentences(config.data)
    words, counts = count_words(text, config.word2vec.min_count)
    model = Word2Vec(words, counts, config.word2vec, seed=config.train.seed)
    corpus = model.encode(text)
    log.info("word2vec: %d words of text, %d in the vocabulary", corpus.words, len(model.words))
    chunks = list(model.chunks(corpus, CHUNK_WORDS))
    threads = config.train.threads or torch.get_num_threads()
    stopping = Stopping(config.train.max_minutes, resume_command)
    check = None if resume else lambda: ckpt.check_new_run(folder)
    with lock.hold(folder, check=check):
        step = _restore(folder, model) if resume else 0
        folder.write_run_config(config.to_toml())
        stopping.begin()
        stopped = "finished"
        with stopping.on_signals(lambda: step):
            while step < len(chunks):
                progress = chunks[step]
                record = _train_step(model, progress, threads, step + 1, stopping)
                step += 1
                folder.append_metrics(record)
                info = {**record, "loss": record["train_loss"], "total": len(chunks)}
                for callback in callbacks:
                    callback({**info, "tokens": progress.corpus.words})
                stopped = stopping.after(step, torch.device("cpu"), None) or "finished"
                if (
                    stopped != "finished"
                    or step == len(chunks)
                    or chunks[step].epoch != progress.epoch
                ):
                    _save(folder, model, step)
                if stopped != "finished":
                    break
        history = _finish(folder, model, step)
    return TrainResult(model, step, stopped, folder.root, history)


def _train_step(
    model: Word2Vec, progress: Progress, threads: int, step: int, stopping: Stopping
) -> dict[str, Any]:
    start = time.perf_counter()
    loss, updates = model.train_pass(progress.corpus, progress.alphas, progress.seed, threads)
    seconds = max(time.perf_counter() - start, 1e-9)
    return {
        "step": step,
        "epoch": progress.epoch + 1,
        "train_loss": loss / max(updates, 1),
        "lr": progress.alphas[1],
        "words_per_s": progress.corpus.words / seconds,
        "minutes": round(stopping.minutes, 2),
    }


def _save(folder: RunFolder, model: Word2Vec, step: int) -> None:
    state = {
        "task": "word2vec",
        "step": step,
        "settings": dataclasses.asdict(model.config),
        "seed": model.seed,
        "words": model.words,
        "counts": model.counts,
        "inputs": model.vectors.inputs,
        "outputs": model.vectors.outputs,
    }
    atomic_write(folder.trainer_state, lambda p: torch.save(state, p))
    save_vectors(model.word_vectors(), folder.vectors, binary=True)


def _restore(folder: RunFolder, model: Word2Vec) -> int:
    if not folder.trainer_state.is_file():
        raise AttnkitError(
            f"{folder.root} holds no word2vec run to resume; start it without --resume"
        )
    state = torch.load(folder.trainer_state, weights_only=True)
    if state.get("task") != "word2vec":
        raise AttnkitError(
            f"{folder.root} holds a Transformer's run, not word2vec's; choose another train.out_dir"
        )
    settings = {**dataclasses.asdict(model.config), "seed": model.seed}
    changed = [
        k for k, v in settings.items() if {**state["settings"], "seed": state["seed"]}[k] != v
    ]
    if changed:
        raise AttnkitError(
            f"{folder.root} was trained with other {', '.join(changed)}; resume with the "
            "settings the run started with, or start a new run"
        )
    if state["words"] != model.words or not torch.equal(state["counts"], model.counts):
        raise AttnkitError(
            f"the vocabulary of {folder.root} differs from the one this config's text gives; "
            "resume with the config and text the run started with"
        )
    # steps recorded after the last save are trained again: their records go
    folder.write_metrics(
        r for r in folder.read_metrics() if r["step"] <= state["step"] and "train_loss" in r
    )
    model.vectors.inputs.copy_(state["inputs"])
    model.vectors.outputs.copy_(state["outputs"])
    log.info("resuming word2vec at step %d", state["step"])
    return int(state["step"])


def _finish(folder: RunFolder, model: Word2Vec, step: int) -> list[dict[str, Any]]:
    """Score the vectors on the benchmarks gensim ships, if it is installed; draw the curves."""
    vectors = model.word_vectors()
    try:
        paths = {name: evaluation.benchmark_file(name) for name in evaluation.BENCHMARKS}
    except AttnkitError as err:
        log.info("the vectors are not scored: %s", err)
        paths = {}
    if paths:
        record: dict[str, Any] = {"step": step}
        for name in ("wordsim353", "simlex999"):
            try:
                score = evaluation.word_similarity(vectors, paths[name])
            except AttnkitError as err:  # a small vocabulary may know too few pairs
                log.info("%s is not scored: %s", name, err)
                continue
            record[name], record[f"{name}_coverage"] = score.spearman, score.coverage
        analogies = evaluation.analogies(vectors, paths["analogies"])
        record["analogy"], record["analogy_coverage"] = analogies.accuracy, analogies.coverage
        folder.append_metrics(record)
        log.info(
            "WordSim-353 rho %.3f, SimLex-999 rho %.3f, analogies %.1f%% (of %.0f%% asked)",
            record.get("wordsim353", float("nan")), record.get("simlex999", float("nan")),
            100 * analogies.accuracy, 100 * analogies.coverage,
        )  # fmt: skip
    history = folder.read_metrics()
    losses = [{k: r[k] for k in ("step", "train_loss", "lr")} for r in history if "train_loss" in r]
    plot_curves(losses, folder.curves)
    return history
