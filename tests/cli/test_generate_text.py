"""`attnkit generate` prints the prompt and its continuation as the tokenizer decodes them
together (issue 54): a word-level or BPE continuation decoded alone lost the space before its
first word, and `the cat` went on as `the cateats`. One run per tokenizer kind whose decoder
joins words differently: characters, words, BPE, byte-level BPE."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from attnkit.generation import GenerationConfig, generate
from attnkit.run import load_run
from tests.helpers import tiny_run

KINDS = ("char", "word", "bpe", "byte-bpe")
PROMPT = "the cat"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("runs")
    return {kind: tiny_run(tmp / kind, "decoder", kind=kind) for kind in KINDS}


def greedy_ids(run: Path, new: int) -> tuple[list[int], list[int]]:
    """The prompt's ids and the greedy continuation's, from the library alone."""
    loaded = load_run(run)
    tokenizer = loaded.tokenizer
    config = GenerationConfig(max_new_tokens=new, eos_token_id=tokenizer.eos_id)
    ids = tokenizer.encode(PROMPT)
    return ids, generate(loaded.model, torch.tensor([ids]), config=config).new_tokens()[0]


@pytest.mark.parametrize("kind", KINDS)
def test_the_continuation_is_printed_as_decoded_with_its_prompt(runs, kind, capsys) -> None:
    prompt, new = greedy_ids(runs[kind], 8)
    tokenizer = load_run(runs[kind]).tokenizer
    assert new and tokenizer.decode(prompt) == PROMPT  # the test's own premise
    args = ["generate", str(runs[kind]), "--prompt", PROMPT, "--greedy", "--max-new-tokens", "8"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed == tokenizer.decode(prompt + new) + "\n"


@pytest.mark.parametrize("kind", ["word", "bpe"])
def test_a_word_level_continuation_keeps_its_space(runs, kind, capsys) -> None:
    _, new = greedy_ids(runs[kind], 8)
    tokenizer = load_run(runs[kind]).tokenizer
    alone = tokenizer.decode(new)
    assert not alone.startswith(" ")  # decoded alone, the first word has no space before it
    main(["generate", str(runs[kind]), "--prompt", PROMPT, "--greedy", "--max-new-tokens", "8"])
    printed = capsys.readouterr().out
    assert printed.startswith(PROMPT + " ") and PROMPT + alone not in printed
