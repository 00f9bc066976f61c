"""What the word-vector tasks of `attnkit train` (word2vec, GloVe) share: the checks that
start a run, their state saved and resumed, and the scores and curves that end a run.

A state (trainer_state.pt) holds the task's name, the step, the settings and seed, the
vocabulary and its counts, and the task's tensors; the vectors go beside it as vectors.bin.
A run resumes only with the settings and the vocabulary it started with, its records after
the last save dropped, as those steps are trained again.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Protocol

import torch
from torch import Tensor

from attnkit.embeddings import evaluation
from attnkit.embeddings.vectors import WordVectors, save_vectors
from attnkit.errors import AttnkitError
from attnkit.files import atomic_write
from attnkit.pretokenize import Pretokenizer
from attnkit.run import RunFolder
from attnkit.train import lock, new_run
from attnkit.train.run_config import RunConfig
from attnkit.train.validate import validate
from attnkit.train.vector_text import pretokenizer_for
from attnkit.viz import plot_curves

log = logging.getLogger(__name__)


class VectorModel(Protocol):
    """What a state records of a model: its settings, seed and vocabulary."""

    config: Any
    seed: int
    words: list[str]
    counts: Tensor


def begin(config: RunConfig, resume: bool) -> tuple[RunFolder, Pretokenizer | None]:
    """Check `config` and its run folder (new, or one to resume), then learn its
    [pretokenize] steps: the folder and the pretokenizer (None if none)."""
    validate(config)
    folder = RunFolder(config.train.out_dir)
    lock.check_free(folder)
    if not resume:
        new_run.check_new_run(folder)
    return folder, pretokenizer_for(config)


def save_state(
    folder: RunFolder,
    task: str,
    step: int,
    model: VectorModel,
    tensors: dict[str, Tensor],
    vectors: WordVectors,
) -> None:
    """Write the state of `model` after `step` steps, then its vectors."""
    state = {
        "task": task,
        "step": step,
        "settings": dataclasses.asdict(model.config),
        "seed": model.seed,
        "words": model.words,
        "counts": model.counts,
        **tensors,
    }
    atomic_write(folder.trainer_state, lambda p: torch.save(state, p))
    save_vectors(vectors, folder.vectors, binary=True)


def restore_state(folder: RunFolder, task: str, model: VectorModel) -> dict[str, Any]:
    """The saved state of a `task` run that `model` (of this config and text) may resume."""
    if not folder.trainer_state.is_file():
        raise AttnkitError(
            f"{folder.root} holds no {task} run to resume; start it without --resume"
        )
    state = folder.read_trainer_state()
    if state.get("task") != task:
        other = f"a {state['task']} run" if state.get("task") else "a Transformer's run"
        raise AttnkitError(
            f"{folder.root} holds {other}, not {task}'s; choose another train.out_dir"
        )
    settings = {**dataclasses.asdict(model.config), "seed": model.seed}
    saved = {**state["settings"], "seed": state["seed"]}
    changed = [k for k, v in settings.items() if saved.get(k) != v]
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
    log.info("resuming %s at step %d", task, state["step"])
    return state


def finish(folder: RunFolder, vectors: WordVectors, step: int) -> list[dict[str, Any]]:
    """Score the vectors on the benchmarks gensim ships, if it is installed (metrics.jsonl);
    draw the curves; return the run's records."""
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
