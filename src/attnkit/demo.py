"""The built-in demo: a small Transformer learns to reverse digit strings in about a minute.

The demo is an app over the library, with nothing of its own below it: it
reads its run config (the `demo` recipe, shipped in the package), trains the
`reverse` task (`attnkit.data.reverse`, built in `train/tasks.py` like every
task) with the `Trainer`, decodes held-out strings with `generate`, and draws
the decoder's cross-attention, which learns to read the source backwards (an
anti-diagonal). Needing no data, it proves the whole pipeline on a CPU.

The demo starts afresh each time, so it deletes the run folder it finds, but
only one it made itself: a run of its own task and model (its saved
run_config.toml says so). Any other folder there stops it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnkit import recipes
from attnkit.checks import check, positive_int
from attnkit.data.reverse import BOS, EOS, ReverseTask, show
from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel
from attnkit.run import RunFolder
from attnkit.train.run_config import RunConfig
from attnkit.train.tasks import reverse_exact_match, train
from attnkit.viz import plot_cross_attention

CONFIG = recipes.path("demo")


@dataclass(frozen=True)
class DemoReport:
    """What one demo run shows.

    examples: every held-out string scored, as (source, expected, output) text.
    accuracy: the share of them reversed exactly.
    """

    model: TransformerModel
    accuracy: float
    examples: list[tuple[str, str, str]]
    train_seconds: float
    picture: Path
    run_dir: Path


def demo_run_config(**overrides: Any) -> RunConfig:
    """The demo's RunConfig; `overrides` are `section.key` names, e.g. {"train.steps": 300}."""
    return RunConfig.load(
        CONFIG, [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in overrides.items()]
    )


MAX_EVAL_EXAMPLES = 1_000_000  # held-out strings scored: a second or so each thousand


def run_demo(
    config: RunConfig,
    picture: str | Path,
    eval_examples: int = 1000,
    *,
    callbacks: Sequence[Callable[[dict[str, Any]], None]] = (),
) -> DemoReport:
    """Train afresh into `train.out_dir`, score `eval_examples` held-out strings (drawn by
    `train.seed` + 1) and draw the first one's cross-attention to `picture`."""
    # Before any training: a count the scoring cannot draw failed in torch after the run.
    positive_int("eval_examples (--eval-examples)", eval_examples)
    check(
        eval_examples <= MAX_EVAL_EXAMPLES,
        f"eval_examples (--eval-examples) {eval_examples} is more than the demo scores; "
        f"give at most {MAX_EVAL_EXAMPLES:,}",
    )
    run_dir = Path(config.train.out_dir)
    _clear(RunFolder(run_dir), config)
    start = time.perf_counter()
    model = train(config, callbacks=callbacks).model
    train_seconds = time.perf_counter() - start
    task = ReverseTask(max_len=config.data.max_len)
    accuracy, results = reverse_exact_match(model, task, eval_examples, seed=config.train.seed + 1)
    digits = results[0][0]
    picture = plot_cross_attention(
        model,
        [*digits, EOS],
        [BOS, *digits[::-1]],
        picture,
        token=lambda i: show([i]),
        last_layer_heads=False,
        suptitle="cross-attention learns to read the source backwards",
    )
    examples = [(show(s), show(t), show(h)) for s, t, h in results]
    return DemoReport(model, accuracy, examples, train_seconds, picture, run_dir)


def _clear(folder: RunFolder, config: RunConfig) -> None:
    """Empty the demo's run folder for a new run; a folder the demo did not make is refused."""
    root = folder.root
    if root.exists() and not root.is_dir():
        raise AttnkitError(
            f"{root} is a file, where the demo would put its run folder; give it another --out"
        )
    if not root.exists() or not any(root.iterdir()):
        return
    if not _made_by_demo(folder, config):
        raise AttnkitError(
            f"{root} holds files that are not a run of the demo, and the demo starts afresh "
            "each time; give it another --out, or move them"
        )
    shutil.rmtree(root)


def _made_by_demo(folder: RunFolder, config: RunConfig) -> bool:
    """Whether `folder` holds a run of the demo's task and model (the demo's own run, or
    `attnkit train demo`): its saved run config has the demo's [model] and [data]."""
    if not folder.run_config.is_file():
        return False
    try:
        saved = RunConfig.load(folder.run_config)
    except AttnkitError:
        return False
    return saved.model == config.model and saved.data == config.data
