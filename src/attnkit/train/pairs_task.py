"""The `sampled-pairs` task of `attnkit train`: a folder of preference pairs made from a
translation run's sampled translations, ranked by their sentence BLEU against the reference
(`attnkit.train.sampled_pairs` has the ranking).

    [data]   task = "sampled-pairs", corpus, src_lang, tgt_lang, train_split, valid_split,
             batch_size (sources decoded together)
    [pairs]  candidates, temperature, reward, min_gap, max_sources, max_new_tokens
    [train]  init_from (the translation run that samples), out_dir (the pairs' folder), seed

The folder it writes is what the `preference`, `reward-model` and `ppo` tasks read as their
data.corpus. It is written in one go and does not resume.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from attnkit.data.sources import corpus_text
from attnkit.devices import resolve_device
from attnkit.errors import AttnkitError
from attnkit.run import RunFolder, load_run
from attnkit.train import lock, new_run
from attnkit.train.run_config import RunConfig
from attnkit.train.sampled_pairs import sample_pairs, write_pairs
from attnkit.train.stopping import TrainResult
from attnkit.train.validate import validate

log = logging.getLogger(__name__)


def train(
    config: RunConfig,
    *,
    resume: bool = False,
    callbacks: Sequence[Callable[[dict[str, Any]], None]] = (),
    resume_command: str = "attnkit.train.tasks.train(config, resume=True)",
) -> TrainResult:
    """Write the pairs `config` describes into the folder `train.out_dir`."""
    if resume:
        raise AttnkitError(
            "a sampled-pairs run writes its folder in one go, so there is nothing to resume; "
            "start it again with --overwrite"
        )
    validate(config)
    d, s = config.data, config.pairs
    folder = RunFolder(config.train.out_dir)
    run = load_run(config.train.init_from, resolve_device(config.train.device))
    torch.manual_seed(config.train.seed)
    history = []
    with lock.hold(folder, check=lambda: _check_new(folder)):
        folder.write_run_config(config.to_toml())
        for number, split in enumerate((d.train_split, d.valid_split), start=1):
            sources, references = corpus_text(d, split, (d.src_lang, d.tgt_lang))
            if s.max_sources:
                sources, references = sources[: s.max_sources], references[: s.max_sources]
            pairs, summary = sample_pairs(
                run.model, run.tokenizer, sources, references, s, batch_size=d.batch_size
            )
            if not pairs:
                raise AttnkitError(
                    f"no source of the {split} split gave two candidates that differ by more "
                    f"than pairs.min_gap {s.min_gap}; lower it, or raise pairs.candidates or "
                    "pairs.temperature"
                )
            write_pairs(folder.root / f"{split}.jsonl", pairs)
            record = {"step": number, "split": split, **summary}
            folder.append_metrics(record)
            history.append(record)
            log.info("%s: %d pairs from %d sources", split, len(pairs), len(sources))
            for callback in callbacks:
                callback({"step": number, "total": 2})
    return TrainResult(run.model, 2, "finished", folder.root, history)


def _check_new(folder: RunFolder) -> None:
    """A new run's folder, holding no pairs of an earlier one (which --overwrite replaces)."""
    new_run.check_new_run(folder)
    if written := [p.name for p in folder.pair_files() if p.is_file()]:
        raise AttnkitError(
            f"{folder.root} holds the pairs of an earlier run ({', '.join(written)}); pass "
            "--overwrite to write new ones in their place, or choose another train.out_dir"
        )
