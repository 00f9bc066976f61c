"""Metric sinks beyond metrics.jsonl: TensorBoard and Weights & Biases (`train.log_to`).

Rank 0's Trainer tells the sinks of its session in one `LogContext` (the run
folder, the settings, the model, where an example comes from), then hands them
every record of metrics.jsonl, as scalars at the record's step under the
record's own names (`train_loss`, `lr`, `tokens_per_s`, ...; `val_loss`,
`val_ppl`, `bleu`, ...). At each evaluation it adds two pictures: the curves so
far (`attnkit.viz.plot_curves`) and the model's attention on one held-out
example, its first `PICTURE_TOKENS` tokens: cross-attention for an
encoder-decoder, self-attention for a decoder or an encoder. The run config,
with the model's resolved fields, goes in as hyper-parameters.

    RUN_DIR/tensorboard/   event files:  tensorboard --logdir RUN_DIR/tensorboard
    RUN_DIR/wandb/         W&B's run folders, offline unless WANDB_MODE says otherwise
                           (an offline run is uploaded later with `wandb sync`)

A resumed run goes on in the same places: TensorBoard hides what the stopped
session logged after its checkpoint (`purge_step`), as metrics.jsonl drops those
records, and W&B continues the run of the same id. Both packages are optional
extras: `pip install 'attnkit[tensorboard]'`, `pip install 'attnkit[wandb]'`.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnkit.data.batch import Batch
from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel
from attnkit.run import RunFolder
from attnkit.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# The sinks `train.log_to` may name (each the package it needs), and the module it writes with.
LOGGERS = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb"}
PICTURE_TOKENS = 24  # enough to read a sentence's attention, few enough to label every token
WANDB_ID = "attnkit_run_id"  # in RUN_DIR/wandb/: the W&B run that a resumed training continues


def check_installed(names: Iterable[str]) -> None:
    """Stop with one sentence if a sink of `names` lacks its package (nothing is imported)."""
    for name in names:
        if importlib.util.find_spec(name) is None:
            raise AttnkitError(_missing(name))


def _missing(name: str) -> str:
    return (
        f"train.log_to names {name!r}, but the {name} package is not installed; install it "
        f"with pip install 'attnkit[{name}]' or remove {name!r} from train.log_to"
    )


def _import(name: str) -> Any:
    try:
        return importlib.import_module(LOGGERS[name])
    except ImportError:
        raise AttnkitError(_missing(name)) from None


@dataclass(frozen=True)
class LogContext:
    """What the sinks are told of one training session (the Trainer hands it over).

    sinks: the names `train.log_to` lists; `project` and `name` are the W&B run's
        (`train.log_project`, `train.log_name` or else the run folder's name).
    hparams: the run's settings by section, the model's resolved fields under "model".
    metric: `eval.metric`, which TensorBoard's HParams dashboard pairs with the losses.
    start: the step the session goes on from (0 for a new run).
    model, tokenizer: the model whose attention the pictures draw, and its tokenizer.
    examples: batches whose first example the attention picture shows (the validation
        data, or else the training data), None for none.
    is_main: whether this process is rank 0, the one that logs.
    """

    folder: RunFolder
    sinks: tuple[str, ...]
    project: str
    name: str
    hparams: dict[str, dict[str, Any]]
    metric: str
    start: int
    model: TransformerModel
    tokenizer: Tokenizer | None = None
    examples: Iterable[Batch] | None = None
    is_main: bool = True


class Loggers:
    """The open sinks of one training session: a TensorBoard `writer` and a W&B `run`, either
    None. The Trainer calls `record` with each record of metrics.jsonl and `evaluated` after
    each evaluation; as a context manager this closes them, marking a W&B run that ended in
    an error as failed."""

    def __init__(
        self, context: LogContext | None = None, writer: Any = None, run: Any = None
    ) -> None:
        self.context, self.writer, self.run = context, writer, run
        self.example: tuple[list[int], list[int] | None, str] | None = None
        if context is not None and context.examples is not None:
            # The first example; the demo has no validation data, and its training data,
            # drawn afresh from a seed at each pass, gives one without moving the training on.
            first = next(iter(context.examples), None)
            self.example = _example(first, context.model.config.shape)

    def __enter__(self) -> Loggers:
        return self

    def __exit__(self, error: type[BaseException] | None, *_: object) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.run is not None:
            self.run.finish(exit_code=1 if error else 0)

    def record(self, record: dict[str, Any]) -> None:
        """Every number of `record` but its step, at its step."""
        step = record["step"]
        values = {k: float(v) for k, v in record.items() if k != "step"}
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(key, value, step)
        if self.run is not None:
            self.run.log(values, step=step)

    def evaluated(self, step: int, history: list[dict[str, Any]]) -> None:
        """Log the curves of `history` (metrics.jsonl's records so far) and the attention
        picture at `step`."""
        if self.context is None:
            return
        from attnkit.viz import plot_curves

        with tempfile.TemporaryDirectory() as tmp:
            curves = plot_curves(history, Path(tmp) / "curves.png")
            images = {"curves": _pixels(curves)}
            if self.example is not None:
                images["attention"] = _pixels(self._attention(step, Path(tmp) / "attention.png"))
        if self.writer is not None:
            for key, image in images.items():
                self.writer.add_image(key, image, step, dataformats="HWC")
            self.writer.flush()  # an evaluation is worth seeing at once
        if self.run is not None:
            wandb = _import("wandb")
            self.run.log({key: wandb.Image(image) for key, image in images.items()}, step=step)

    def _attention(self, step: int, path: Path) -> Path:
        from attnkit.viz import plot_model_attention

        model, tokenizer = self.context.model, self.context.tokenizer
        ids, tgt, kind = self.example
        name = "cross-attention" if kind == "cross" else f"{kind} self-attention"
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()  # the attention a user of the model sees, without dropout
        # Drawn on a forked generator, so that an exact resume stays exact.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            plot_model_attention(
                model, ids, path, kind=kind, tgt=tgt, suptitle=f"{name} at step {step}",
                token=lambda i: (tokenizer.id_to_token(i) if tokenizer else None) or str(i),
            )  # fmt: skip
        model.train(was_training)
        return path


def open_for(context: LogContext) -> Loggers:
    """The sinks that `context.sinks` names, opened on rank 0 (none elsewhere) in its run
    folder, to go on from `context.start`."""
    if not context.sinks or not context.is_main:
        return Loggers()
    writer = run = None
    if "tensorboard" in context.sinks:
        metrics = ("train_loss", "val_loss", context.metric)
        writer = _tensorboard(context.folder.tensorboard, context.start, context.hparams, metrics)
    if "wandb" in context.sinks:
        run = _wandb(context)
    return Loggers(context, writer, run)


def _tensorboard(logdir: Path, start: int, hparams: dict, metrics: Iterable[str]) -> Any:
    tensorboard = _import("tensorboard")
    from torch.utils.tensorboard.summary import hparams as hparams_summaries

    # A stopped session's events after the checkpoint (`start`) are hidden: they come again.
    writer = tensorboard.SummaryWriter(str(logdir), purge_step=start + 1)
    flat = {
        f"{section}.{key}": value if isinstance(value, int | float | str) else str(value)
        for section, values in hparams.items()
        for key, value in values.items()
    }
    # In this run's own event file, not in a sub-run as `add_hparams` writes them, so that the
    # HParams dashboard pairs them with this run's scalars.
    for summary in hparams_summaries(flat, dict.fromkeys(metrics, 0.0)):
        writer.file_writer.add_summary(summary)
    log.info("logging to TensorBoard event files in %s (tensorboard's logdir)", logdir)
    return writer


def _wandb(context: LogContext) -> Any:
    wandb = _import("wandb")
    folder, project, name = context.folder, context.project, context.name
    id_file = folder.wandb / WANDB_ID
    run_id = id_file.read_text().strip() if context.start > 0 and id_file.is_file() else None
    try:
        run = wandb.init(
            project=project,
            name=name,
            dir=str(folder.root),  # W&B writes its runs into DIR/wandb: folder.wandb
            id=run_id,
            resume="allow" if run_id else None,
            # Offline unless the user says otherwise: training never waits on the network. Read
            # here, as wandb reads the environment once a process.
            mode=os.environ.get("WANDB_MODE", "offline"),
        )
    except wandb.Error as err:
        raise AttnkitError(
            f"W&B could not start the run ({err}); log in with wandb login, or set "
            "WANDB_MODE=offline to keep it on this machine"
        ) from None
    # A resumed session may run under changed settings: they replace the recorded ones.
    run.config.update(context.hparams, allow_val_change=True)
    id_file.parent.mkdir(parents=True, exist_ok=True)
    id_file.write_text(run.id)
    where = f"{Path(run.dir).parent}, to upload with wandb sync" if run.offline else run.url
    log.info("logging to W&B project %r, run %r (id %s): %s", project, name, run.id, where)
    return run


def _example(batch: Batch | None, shape: str) -> tuple[list[int], list[int] | None, str] | None:
    """The ids, decoder input and attention kind of the first example of `batch` (None if it
    has none) for a picture of a model of `shape`."""
    if batch is None:
        return None
    src, tgt = _first_row(batch.src, batch.src_mask), _first_row(batch.tgt, batch.tgt_mask)
    if shape == "encoder-decoder":
        return (src, tgt, "cross") if src and tgt else None
    ids, kind = (tgt, "decoder") if shape == "decoder" else (src, "encoder")
    return (ids, None, kind) if ids else None


def _first_row(ids: torch.Tensor | None, mask: torch.Tensor | None) -> list[int]:
    if ids is None:
        return []
    row = ids[0] if mask is None else ids[0][mask[0].bool()]
    return row[:PICTURE_TOKENS].tolist()


def _pixels(png: Path) -> np.ndarray:
    """A PNG as (height, width, RGB) bytes, the form both sinks take."""
    import matplotlib.image

    return (matplotlib.image.imread(png)[..., :3] * 255).round().astype(np.uint8)
