"""The word2vec task of `attnkit train`: word vectors learned from a corpus, into a run folder.

    [data]      task = "word2vec", corpus (a known corpus, a folder of {split}.{lang}, a file),
                lowercase
    [word2vec]  architecture, dim, window, negative, sample, min_count, epochs, alpha, ...
    [train]     out_dir, seed, threads (0: torch's), max_minutes

The text becomes sentences of words, one a line (`attnkit.train.vector_text`:
runs of letters and digits, punctuation dropped, through the [pretokenize] steps
if any; both languages of a parallel corpus). Training goes in
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

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from attnkit.embeddings.word2vec import Progress, Word2Vec, count_words
from attnkit.run import RunFolder
from attnkit.train import lock, new_run
from attnkit.train.run_config import RunConfig
from attnkit.train.stopping import Stopping, TrainResult
from attnkit.train.vector_runs import begin, finish, restore_state, save_state
from attnkit.train.vector_text import record_pretokenizer, sentences

log = logging.getLogger(__name__)

CHUNK_WORDS = 100_000


def train(
    config: RunConfig,
    *,
    resume: bool = False,
    callbacks: Sequence[Callable[[dict[str, Any]], None]] = (),
    resume_command: str = "attnkit.train.tasks.train(config, resume=True)",
) -> TrainResult:
    """Learn the vectors `config` describes in the run folder `train.out_dir`."""
    folder, pretokenizer = begin(config, resume)
    text = sentences(config.data, pretokenizer)
    words, counts = count_words(text, config.word2vec.min_count)
    model = Word2Vec(words, counts, config.word2vec, seed=config.train.seed)
    corpus = model.encode(text)
    log.info("word2vec: %d words of text, %d in the vocabulary", corpus.words, len(model.words))
    chunks = list(model.chunks(corpus, CHUNK_WORDS))
    threads = config.train.threads or torch.get_num_threads()
    stopping = Stopping(config.train.max_minutes, resume_command)
    check = None if resume else lambda: new_run.check_new_run(folder)
    with lock.hold(folder, check=check):
        step = _restore(folder, model) if resume else 0
        folder.write_run_config(config.to_toml())
        record_pretokenizer(folder, pretokenizer)
        stopping.begin()
        stopped = "finished"
        with stopping.on_signals(lambda: step):
            while step < len(chunks):
                progress = chunks[step]
                record = _train_step(model, progress, threads, step + 1, stopping)
                step += 1
                folder.append_metrics(record)
                log.info("step %d/%d  loss %.4f", step, len(chunks), record["train_loss"])
                # What the Trainer's callbacks get on a logging step (words count as tokens).
                info = {**record, "loss": record["train_loss"], "total": len(chunks)}
                for callback in callbacks:
                    callback({**info, "tokens_per_s": record["words_per_s"]})
                stopped = stopping.after(step, torch.device("cpu"), None) or "finished"
                if (
                    stopped != "finished"
                    or step == len(chunks)
                    or chunks[step].epoch != progress.epoch
                ):
                    _save(folder, model, step)
                if stopped != "finished":
                    break
        history = finish(folder, model.word_vectors(), step)
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
    tensors = {"inputs": model.vectors.inputs, "outputs": model.vectors.outputs}
    save_state(folder, "word2vec", step, model, tensors, model.word_vectors())


def _restore(folder: RunFolder, model: Word2Vec) -> int:
    state = restore_state(folder, "word2vec", model)
    model.vectors.inputs.copy_(state["inputs"])
    model.vectors.outputs.copy_(state["outputs"])
    return int(state["step"])
