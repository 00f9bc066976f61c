"""A Transformer run's tokenizer, and the record of its vocabulary.

The tokenizer is the run folder's own when it holds one (a resumed run), else
`train.init_from`'s (fine-tuning), else one trained on the training text, in
the kind and size of the [data] section, after the [pretokenize] steps if any.
Under torchrun rank 0 alone makes it and writes it into the run folder, where
the other ranks load it. The fingerprint of its vocabulary is recorded in the
run folder, which loading the run checks (`RunFolder.load_tokenizer`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from attnkit.errors import AttnkitError
from attnkit.pretokenize import Pretokenizer
from attnkit.run import RunFolder
from attnkit.tokenizer import Tokenizer
from attnkit.train import distributed as dist
from attnkit.train.run_config import RunConfig

log = logging.getLogger(__name__)


def run_tokenizer(
    config: RunConfig, texts: Iterable[str], extra_specials: Sequence[str] = ()
) -> Tokenizer:
    """The run's tokenizer; under torchrun rank 0 makes it and writes it into the run folder
    (`check_shared_folder` made sure every rank sees it), where the other ranks load it.
    A newly trained one has the task's `extra_specials` after the five (span corruption's
    sentinels)."""
    saved = RunFolder(config.train.out_dir).tokenizer
    info = dist.from_env()
    if not info.active:
        return _make_tokenizer(config, texts, saved, extra_specials)
    made: list[Tokenizer] = []

    def make() -> None:
        made.append(_make_tokenizer(config, texts, saved, extra_specials))
        if not saved.is_file():
            made[0].save(saved)

    dist.refuse_together(make)  # the other ranks wait for rank 0's file, or its refusal
    if info.is_main:
        return made[0]
    log.info("rank %d: using the tokenizer rank 0 wrote, %s", info.rank, saved)
    return Tokenizer.load(saved, _own_rules(config))


def _own_rules(config: RunConfig) -> tuple[str, ...]:
    """The pre-tokenization rule the run config names: the user's own file allows it to be
    imported from the folder's tokenizer, and nothing else (`attnkit.pretokenize.rules`)."""
    return (config.pretokenize.rule,) if config.pretokenize.rule else ()


def _make_tokenizer(
    config: RunConfig, texts: Iterable[str], saved: Path, extra_specials: Sequence[str]
) -> Tokenizer:
    if saved.is_file():
        log.info("using the tokenizer of the run folder, %s", saved)
        return Tokenizer.load(saved, _own_rules(config))
    if config.train.init_from:
        base = RunFolder(config.train.init_from).tokenizer
        if not base.is_file():
            raise AttnkitError(
                f"train.init_from {config.train.init_from!r} has no {base.name}; "
                "fine-tune a run trained with attnkit train"
            )
        return Tokenizer.load(base, _own_rules(config))
    d = config.data
    pretokenizer = Pretokenizer(config.pretokenize) if config.pretokenize.on else None
    return Tokenizer.train(
        d.tokenizer,
        texts=texts,
        vocab_size=d.vocab_size,
        pretokenizer=pretokenizer,
        extra_specials=extra_specials,
    )


def record_vocabulary(folder: RunFolder, tokenizer: Tokenizer, resume: bool) -> None:
    """Record the fingerprint of the vocabulary the run trains with, which loading the run
    checks (`RunFolder.load_tokenizer`).

    A new run records it; a resumed run keeps the one it recorded (a run from
    before fingerprints records it now); a folder that the Trainer will refuse
    (a run there without `resume`, or none to resume) is left alone.
    """
    if folder.trainer_state.exists() != resume:
        return
    if not resume or not folder.fingerprint.exists():
        folder.record_tokenizer(tokenizer)


# The [data] keys that make the tokenizer, which a run folder keeps once it has one.
_VOCABULARY_KEYS = ("tokenizer", "vocab_size")


def keep_vocabulary(config: RunConfig, folder: RunFolder) -> RunConfig:
    """`config` with the vocabulary keys of the run it resumes: its model was trained with the
    tokenizer in the folder, which a resumed run goes on using (and now records so)."""
    if not folder.tokenizer.is_file():
        return config
    saved = folder.data_defaults()
    kept = {
        key: saved[key]
        for key in _VOCABULARY_KEYS
        if key in saved and saved[key] != getattr(config.data, key)
    }
    if not kept:
        return config
    log.warning(
        "%s not applied: a resumed run goes on with the tokenizer its model was trained with, "
        "%s; start a new train.out_dir for another vocabulary",
        ", ".join(
            f"data.{k} {getattr(config.data, k)!r} (the run's is {v!r})" for k, v in kept.items()
        ),
        folder.tokenizer,
    )
    return dataclasses.replace(config, data=dataclasses.replace(config.data, **kept))
