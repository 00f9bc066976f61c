"""Bad input to decoding (`attnkit translate | generate | eval` and their Python functions):
one sentence before any work is done, never a traceback, never a silent surprise."""

import io
import logging
import os
import sys

import pytest

from attnkit import AttnkitError
from attnkit.cli import main
from attnkit.generation import GenerationConfig
from attnkit.inference import complete, translate
from attnkit.run import load_run
from tests.helpers import RUN_LINES

NOT_UTF8 = b"\xff\xfe"  # no UTF-8 text starts with these bytes


@pytest.fixture
def never_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any translation fail the test: a check that must come first did not."""

    def fail(*args, **kwargs):
        raise AssertionError("decoding ran before the output path was checked")

    # The evaluation module first: patching it imports it, and an import after inference's
    # patch would bind `fail` as its translate for good (the undo would then restore `fail`).
    monkeypatch.setattr("attnkit.evaluation.run.translate", fail)
    monkeypatch.setattr("attnkit.inference.translate", fail)


def stdin_of(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_translate_names_the_input_file_line_that_is_not_utf8(mt_run, tmp_path, capsys) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(RUN_LINES[0].encode() + b"\n" + NOT_UTF8 + b" hund\n")
    assert main(["translate", str(mt_run), "--input", str(source)]) == 2
    err = capsys.readouterr().err
    assert f"{source} line 2 is not valid UTF-8 (byte 0 of the line); re-encode it" in err
    assert "Traceback" not in err


def test_translate_names_the_standard_input_line_that_is_not_utf8(
    mt_run, monkeypatch, capsys
) -> None:
    stdin_of(monkeypatch, RUN_LINES[0].encode() + b"\n" + b"ein " + NOT_UTF8 + b"\n")
    assert main(["translate", str(mt_run), "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "standard input line 2 is not valid UTF-8 (byte 4 of the line)" in err


def test_translate_reads_utf8_standard_input_line_by_line(mt_run, monkeypatch, capsys) -> None:
    stdin_of(monkeypatch, "\n".join(RUN_LINES[:2]).encode() + b"\n")
    assert main(["translate", str(mt_run), "--max-new-tokens", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_generate_refuses_a_prompt_that_is_not_utf8_before_printing_it(lm_run, capsys) -> None:
    # How Python hands over an argument whose bytes are not UTF-8: lone surrogates.
    prompt = b"a dog \xff".decode("utf-8", "surrogateescape")
    assert main(["generate", str(lm_run), "--prompt", prompt]) == 2
    out, err = capsys.readouterr()
    assert "the prompt is not valid UTF-8 (character 6); re-encode it as UTF-8" in err
    assert out == ""


def test_python_text_that_is_not_utf8_is_refused_with_its_line(mt_run, lm_run) -> None:
    bad = b"ein \xff".decode("utf-8", "surrogateescape")
    run = load_run(mt_run)
    with pytest.raises(AttnkitError, match="input line 2 is not valid UTF-8 \\(character 4\\)"):
        translate(run.model, run.tokenizer, [RUN_LINES[0], bad])
    with pytest.raises(AttnkitError, match="text 2 of the batch is not valid UTF-8"):
        run.tokenizer.encode_batch([RUN_LINES[0], bad])
    lm = load_run(lm_run)
    with pytest.raises(AttnkitError, match="the prompt is not valid UTF-8"):
        complete(lm.model, lm.tokenizer, bad)


@pytest.mark.parametrize("count", ["0", "-5"])
def test_max_new_tokens_zero_is_refused_like_a_negative_count(lm_run, capsys, count) -> None:
    """0 used to mean the default (max_len - 1 tokens) while -5 was refused."""
    assert main(["generate", str(lm_run), "--prompt", "a", "--max-new-tokens", count]) == 2
    assert f"max_new_tokens must be a positive integer, got {count}" in capsys.readouterr().err


def test_negative_threads_are_one_sentence(lm_run, capsys) -> None:
    assert main(["generate", str(lm_run), "--prompt", "a", "--threads", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--threads must be a non-negative integer (0 for the default), got -1" in err


def test_a_closed_pipe_ends_the_output_quietly(lm_run, monkeypatch, capsys) -> None:
    """`attnkit generate ... | head -c 1`: the reader leaves; no traceback, 141 as for SIGPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        args = ["generate", str(lm_run), "--prompt", "a dog", "--max-new-tokens", "4"]
        assert main(args) == 141
        stdout.write("later output")  # stdout now leads to devnull: exit's flush cannot fail
        stdout.flush()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("option", ["--output", "--attention-plot"])
def test_an_unwritable_translate_output_is_found_before_decoding(
    mt_run, tmp_path, capsys, never_decodes, option
) -> None:
    source = tmp_path / "in.txt"
    source.write_text(RUN_LINES[0] + "\n")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = ["translate", str(mt_run), "--input", str(source)]
    assert main([*args, option, str(blocker / "out")]) == 2
    message = f"{option} {blocker / 'out'} cannot be written: {blocker} is a file, not a folder"
    assert message in capsys.readouterr().err
    assert main([*args, option, str(tmp_path)]) == 2
    assert f"{option} {tmp_path} is a folder; give a file path" in capsys.readouterr().err


def test_an_unwritable_eval_output_is_found_before_decoding(
    mt_run, tmp_path, capsys, never_decodes
) -> None:
    assert main(["eval", str(mt_run), "--output", str(tmp_path)]) == 2
    assert f"--output {tmp_path} is a folder; give a file path" in capsys.readouterr().err


def test_translate_output_goes_into_a_new_folder(mt_run, tmp_path) -> None:
    source = tmp_path / "in.txt"
    source.write_text(RUN_LINES[0] + "\n")
    output = tmp_path / "new" / "out.txt"
    args = ["translate", str(mt_run), "--input", str(source), "--max-new-tokens", "2"]
    assert main([*args, "--output", str(output)]) == 0
    assert len(output.read_text().splitlines()) == 1


def test_unknown_characters_are_counted_in_one_warning(mt_run, lm_run, caplog) -> None:
    """A character vocabulary without capitals read them as <unk> without a word."""
    run, lm = load_run(mt_run), load_run(lm_run)
    config = GenerationConfig(max_new_tokens=2)
    with caplog.at_level(logging.WARNING, logger="attnkit.inference"):
        translate(run.model, run.tokenizer, ["EIN hund", "ein HUND", "ein hund"], config)
        list(complete(lm.model, lm.tokenizer, "A DOG", config))
    warnings = [r.getMessage() for r in caplog.records if "<unk>" in r.getMessage()]
    assert warnings == [
        "7 tokens of the input became <unk>: the tokenizer's vocabulary lacks those characters",
        "4 tokens of the input became <unk>: the tokenizer's vocabulary lacks those characters",
    ]


def test_a_negative_eval_limit_is_refused(lm_run, capsys) -> None:
    """--limit -1 dropped the last batch (a Python slice) without a word."""
    assert main(["eval", str(lm_run), "--limit", "-1"]) == 2
    err = capsys.readouterr().err
    assert "limit must be a non-negative integer (0 for the whole split), got -1" in err


def test_generate_without_a_prompt_or_with_no_batch_says_what_to_give(
    lm_run, tmp_path, capsys
) -> None:
    assert main(["generate", str(lm_run)]) == 2
    assert "give a prompt: --prompt TEXT (again for more), or --input FILE" in (
        capsys.readouterr().err
    )
    args = ["generate", str(lm_run), "--prompt", "a", "--prompt", "b", "--batch-size", "0"]
    assert main(args) == 2
    assert "--batch-size must be a positive integer, got 0" in capsys.readouterr().err
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(b"a dog\n" + NOT_UTF8 + b"\n")
    assert main(["generate", str(lm_run), "--prompt", "a", "--input", str(prompts)]) == 2
    out, err = capsys.readouterr()
    assert f"{prompts} line 2 is not valid UTF-8" in err and out == ""
