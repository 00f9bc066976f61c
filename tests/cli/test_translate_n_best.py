"""`attnkit translate --n-best K` (issue 54): the K best translations of each line with their
scores, in Moses' n-best format, as Python (`translate_n_best`, `generate` with
`num_return_sequences`) and HTTP (`n_best`) give them."""

from __future__ import annotations

import pytest
import torch

from attnkit.cli import main
from attnkit.generation import GenerationConfig, generate
from attnkit.inference import encode_sources
from attnkit.run import load_run
from tests.helpers import RUN_LINES


def n_best_of(out: str) -> list[tuple[int, str, float]]:
    rows = [line.split(" ||| ") for line in out.splitlines()]
    assert all(len(row) == 3 for row in rows), out
    return [(int(i), text, float(score)) for i, text, score in rows]


def test_translate_prints_the_k_best_of_each_line_with_their_scores(mt_run, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text(f"{RUN_LINES[0]}\n\n{RUN_LINES[1]}\n")
    args = ["translate", str(mt_run), "--input", str(source), "--max-new-tokens", "6"]
    assert main([*args, "--beam", "4", "--n-best", "3", "--no-progress"]) == 0
    rows = n_best_of(capsys.readouterr().out)
    assert [i for i, _, _ in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [text for i, text, _ in rows if i == 1] == ["", "", ""]  # an empty line stays empty
    assert main([*args, "--beam", "4", "--no-progress"]) == 0
    best = capsys.readouterr().out.splitlines()
    assert [text for i, text, _ in rows if i != 1][::3] == [best[0], best[2]]

    run = load_run(mt_run)  # the same list from the library's beam search alone
    tokenizer = run.tokenizer
    config = GenerationConfig(
        max_new_tokens=6, num_beams=4, num_return_sequences=3, eos_token_id=tokenizer.eos_id,
        pad_token_id=tokenizer.pad_id, decoder_start_token_id=tokenizer.bos_id,
    )  # fmt: skip
    for i, line in ((0, RUN_LINES[0]), (2, RUN_LINES[1])):
        (ids,) = encode_sources(tokenizer, [line], run.model.config.max_len)
        out = generate(run.model, torch.tensor([ids]), None, config)
        mine = [(text, score) for j, text, score in rows if j == i]
        assert [text for text, _ in mine] == tokenizer.decode_batch(out.new_tokens())
        expected = out.sequences_scores.tolist()
        assert [score for _, score in mine] == pytest.approx(expected, abs=1e-4)
        assert expected == sorted(expected, reverse=True)


@pytest.mark.parametrize(("beam", "n"), [("1", "2"), ("3", "4"), ("1", "1")])
def test_n_best_needs_a_beam_at_least_as_wide(mt_run, beam, n, capsys):
    code = main(["translate", str(mt_run), "--beam", beam, "--n-best", n])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"--n-best {n} lists beam search's best translations" in err
    assert f"give --beam {max(int(n), 2)} or more" in err
