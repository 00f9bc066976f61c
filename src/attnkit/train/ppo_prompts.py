"""The prompts a `ppo` run answers (`attnkit.train.ppo_task`): the distinct prompts of its pairs
folder as ids, and the batches it draws from them, in a new shuffled order each pass, which a
resumed run draws again up to where it stopped (one batch a PPO step)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from attnkit.data.preference import read_pairs
from attnkit.errors import AttnkitError
from attnkit.tokenizer import Tokenizer
from attnkit.train.run_config import RunConfig

log = logging.getLogger(__name__)


def prompt_ids(
    config: RunConfig, tokenizer: Tokenizer, split: str, encoder_decoder: bool, room: int
) -> list[list[int]]:
    """The distinct prompts of the data.corpus folder's `{split}.jsonl`, as ids: with </s> for
    an encoder-decoder's source; those over `room` ids skipped."""
    path = Path(config.data.corpus) / f"{split}.jsonl"
    texts = list(dict.fromkeys(pair.prompt for pair in read_pairs(path)))
    ids = [p for p in tokenizer.encode_batch(texts, add_eos=encoder_decoder) if len(p) <= room]
    if not ids:
        raise AttnkitError(
            f"every prompt of {path} is longer than {room} ids, which leaves no room for "
            "ppo.max_new_tokens within the model's max_len; lower ppo.max_new_tokens"
        )
    if len(ids) < len(texts):
        log.warning("%s: skipped %d prompts over %d ids", path, len(texts) - len(ids), room)
    return ids


def batches(
    prompts: list[list[int]], size: int, seed: int, skip: int = 0
) -> Iterator[list[list[int]]]:
    """`size` prompts at a time, in a new shuffled order each pass; the first `skip` batches
    (those a resumed run has trained on) drawn but not given."""
    generator = torch.Generator().manual_seed(seed)
    drawn = 0
    while True:
        order = torch.randperm(len(prompts), generator=generator).tolist()
        for start in range(0, len(order) - size + 1, size):  # whole batches only
            drawn += 1
            if drawn > skip:
                yield [prompts[i] for i in order[start : start + size]]
