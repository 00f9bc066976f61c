"""The GloVe task of `attnkit train`: word vectors from co-occurrence counts, into a run folder.

    [data]   task = "glove", corpus (a known corpus, a folder of {split}.{lang}, a file),
             lowercase
    [glove]  dim, window, min_count, symmetric, distance_weighting, x_max, alpha, eta, epochs
    [train]  out_dir, seed, threads (0: torch's), max_minutes

The text becomes sentences of words as word2vec's does (`attnkit.train.vector_text`,
through the [pretokenize] steps if any) and is read twice, a sentence at a time: once to
count the words (those under `glove.min_count` are left out), once to count their
co-occurrences in chunks
(`attnkit.embeddings.glove`). A step is one epoch of AdaGrad over the shuffled counts: it
appends its mean cost, rate, pairs and words a second to metrics.jsonl; the state is
saved (trainer_state.pt) and the vectors written (vectors.bin, w + c) after each, and when
the run stops (Ctrl-C, SIGTERM, `train.max_minutes`) `--resume` recounts, reshuffles in
the same order and goes on from the last saved epoch, so that one thread resumes to the
same vectors. At the end metrics.jsonl holds the vectors' WordSim-353 and SimLex-999
Spearman correlations and Google analogy accuracy, where gensim's files are found.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from attnkit.embeddings.glove import Glove, count_cooccurrences
from attnkit.embeddings.word2vec import count_words
from attnkit.run import RunFolder
from attnkit.train import lock, new_run
from attnkit.train.run_config import RunConfig
from attnkit.train.stopping import Stopping, TrainResult
from attnkit.train.vector_runs import begin, finish, restore_state, save_state
from attnkit.train.vector_text import iter_sentences, record_pretokenizer

log = logging.getLogger(__name__)

TENSORS = ("w", "c", "bw", "bc", "gw", "gc", "gbw", "gbc")  # the state's, as in `Parameters`


def train(
    config: RunConfig,
    *,
    resume: bool = False,
    callbacks: Sequence[Callable[[dict[str, Any]], None]] = (),
    resume_command: str = "attnkit.train.tasks.train(config, resume=True)",
) -> TrainResult:
    """Learn the vectors `config` describes in the run folder `train.out_dir`."""
    folder, pretokenizer = begin(config, resume)
    text = config.data, pretokenizer
    words, counts = count_words(iter_sentences(*text), config.glove.min_count)
    model = Glove(words, counts, config.glove, seed=config.train.seed)
    start = time.perf_counter()
    pairs, table_bytes = count_cooccurrences(iter_sentences(*text), words, config.glove)
    corpus_words = int(counts.sum())
    log.info(
        "GloVe: %d words of text, %d in the vocabulary, %d co-occurring pairs counted in %.1f s "
        "(table %.0f MB, pairs %.0f MB)",
        corpus_words, len(words), len(pairs), time.perf_counter() - start,
        table_bytes / 2**20, pairs.bytes / 2**20,
    )  # fmt: skip
    model.shuffle(pairs)
    threads = config.train.threads or torch.get_num_threads()
    stopping = Stopping(config.train.max_minutes, resume_command)
    check = None if resume else lambda: new_run.check_new_run(folder)
    epochs = config.glove.epochs
    with lock.hold(folder, check=check):
        step = _restore(folder, model) if resume else 0
        folder.write_run_config(config.to_toml())
        record_pretokenizer(folder, pretokenizer)
        stopping.begin()
        stopped = "finished"
        with stopping.on_signals(lambda: step):
            while step < epochs:
                begun = time.perf_counter()
                cost = model.epoch(pairs, threads)
                seconds = max(time.perf_counter() - begun, 1e-9)
                step += 1
                record = {
                    "step": step,
                    "epoch": step,
                    "train_loss": cost,
                    "lr": config.glove.eta,
                    "pairs_per_s": len(pairs) / seconds,
                    "words_per_s": corpus_words / seconds,
                    "minutes": round(stopping.minutes, 2),
                }
                folder.append_metrics(record)
                info = {**record, "loss": cost, "total": epochs}
                for callback in callbacks:
                    callback({**info, "tokens": corpus_words})
                stopped = stopping.after(step, torch.device("cpu"), None) or "finished"
                _save(folder, model, step)
                if stopped != "finished":
                    break
        history = finish(folder, model.word_vectors(), step)
    return TrainResult(model, step, stopped, folder.root, history)


def _save(folder: RunFolder, model: Glove, step: int) -> None:
    tensors = {name: getattr(model.params, name) for name in TENSORS}
    save_state(folder, "glove", step, model, tensors, model.word_vectors())


def _restore(folder: RunFolder, model: Glove) -> int:
    state = restore_state(folder, "glove", model)
    for name in TENSORS:
        getattr(model.params, name).copy_(state[name])
    return int(state["step"])
