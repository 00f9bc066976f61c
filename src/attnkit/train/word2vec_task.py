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
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from attnkit.data import CORPORA
from attnkit.data.hf_datasets import is_dataset
from attnkit.data.sources import corpus_text, text_lines
from attnkit.embeddings.word2vec import Progress, Word2Vec, count_words
from attnkit.errors import AttnkitError
from attnkit.files import atomic_write
from attnkit.pretokenize import Pretokenizer
from attnkit.run import RunFolder
from attnkit.train import checkpoint as ckpt
from attnkit.train import lock
from attnkit.train.run_config import DataSection, RunConfig
from attnkit.train.stopping import Stopping, TrainResult
from attnkit.train.validate import validate
from attnkit.train.vector_runs import finish, restore_state, save_state

log = logging.getLogger(__name__)

CHUNK_WORDS = 100_000
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")


def split_words(line: str) -> list[str]:
    """The words of a line: runs of letters and digits, "don't" one word, punctuation dropped."""
    return _WORD.findall(line)


def sentences(data: DataSection, pretokenizer: Pretokenizer | None = None) -> list[list[str]]:
    """The training text of `data` as sentences of words, empty lines left out; through
    `pretokenizer`'s steps if given (`attnkit.pretokenize`)."""
    return list(iter_sentences(data, pretokenizer))


def iter_sentences(
    data: DataSection, pretokenizer: Pretokenizer | None = None
) -> Iterator[list[str]]:
    """`sentences`, one at a time: a text file (or a monolingual corpus) is read as it goes,
    so that a second pass reads it again rather than holding it."""
    lines = _lines(data)
    if pretokenizer is None:
        return (words for line in lines if (words := split_words(line)))
    split = (pretokenizer.split(line, split_words) for line in lines)
    return (words for found in split if (words := pretokenizer.words(found)))


def pretokenizer_for(config: RunConfig) -> Pretokenizer | None:
    """The [pretokenize] steps of a word-vector run, its phrases learned from the text
    (which is read once more for each pass); None if none."""
    if not config.pretokenize.on:
        return None
    pretokenizer = Pretokenizer(config.pretokenize)
    if config.pretokenize.phrases:
        split = Pretokenizer(dataclasses.replace(config.pretokenize, phrases=0, stop_words="",
                                                 stem="none"), rule=pretokenizer.rule)  # fmt: skip
        pretokenizer.learn(_Reread(lambda: iter_sentences(config.data, split)))
        log.info("%d phrases learned, such as %s", len(pretokenizer.phrases),
                 ", ".join(list(pretokenizer.phrases.passes[0].scores)[:5]))  # fmt: skip
    return pretokenizer


def record_pretokenizer(folder: RunFolder, pretokenizer: Pretokenizer | None) -> None:
    """Keep the steps and phrases a word-vector run's words went through (pretokenize.json)."""
    if pretokenizer is not None:
        data = json.dumps(pretokenizer.to_dict(), ensure_ascii=False, indent=1)
        atomic_write(folder.pretokenize, lambda p: p.write_text(data, encoding="utf-8"))


class _Reread:
    """An iterable that reads its source afresh each time it is iterated."""

    def __init__(self, source: Callable[[], Iterator[list[str]]]) -> None:
        self.source = source

    def __iter__(self) -> Iterator[list[str]]:
        return self.source()


def _lines(data: DataSection) -> Iterable[str]:
    known = CORPORA.get(data.corpus)
    if known is not None and known.pairs is not None:
        raise AttnkitError(
            f"word2vec learns from running text, which {data.corpus} is not; use "
            "multi30k, tinyshakespeare or a text file as data.corpus"
        )
    folder = known is None and Path(data.corpus).is_dir() and not is_dataset(data)
    if (known is not None and known.langs) or folder:
        langs = (data.src_lang, data.tgt_lang)
        lines: Iterable[str] = (
            line for side in corpus_text(data, data.train_split, langs) for line in side
        )
    else:
        lines = (line.lower() if data.lowercase else line for line in text_lines(data))
    return lines


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
        ckpt.check_new_run(folder.root)
    pretokenizer = pretokenizer_for(config)
    text = sentences(config.data, pretokenizer)
    words, counts = count_words(text, config.word2vec.min_count)
    model = Word2Vec(words, counts, config.word2vec, seed=config.train.seed)
    corpus = model.encode(text)
    log.info("word2vec: %d words of text, %d in the vocabulary", corpus.words, len(model.words))
    chunks = list(model.chunks(corpus, CHUNK_WORDS))
    threads = config.train.threads or torch.get_num_threads()
    stopping = Stopping(config.train.max_minutes, resume_command)
    check = None if resume else lambda: ckpt.check_new_run(folder.root)
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
