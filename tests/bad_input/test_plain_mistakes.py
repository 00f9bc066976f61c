"""Plain user errors that reached the catch-all sentence ("... failed where attnkit did not
expect it ... please report it", issue 53, POOR) are one sentence of their own: a symbolic-link
loop given to `serve`, `--max-new-tokens` of 10^29. (Ranks: test_ranks.py; T5 folders:
test_hf_imports.py; a rule returning an int: test_folder_code.py; pictures: test_pictures.py.)"""

from __future__ import annotations

import pytest

from attnkit.cli import main


def one_sentence(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "did not expect" not in err, err
    return err


@pytest.mark.parametrize("named", [False, True], ids=["plain", "named"])
def test_a_symlink_loop_given_to_serve_is_one_sentence(tmp_path, named, capsys) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    spec = f"mine={loop}" if named else str(loop)
    assert main(["serve", spec, "--port", "0"]) == 2
    assert f"{loop} is a loop of symbolic links; give the run folder" in one_sentence(capsys)


@pytest.mark.parametrize("command", ["generate", "translate"])
def test_max_new_tokens_past_its_bound_is_one_sentence(
    lm_run, mt_run, tmp_path, command, capsys
) -> None:
    run = lm_run if command == "generate" else mt_run
    most = ["--max-new-tokens", str(10**29)]
    (tmp_path / "in.txt").write_text("ab\n")
    args = ["--prompt", "ab"] if command == "generate" else ["--input", str(tmp_path / "in.txt")]
    assert main([command, str(run), *args, *most]) == 2
    said = one_sentence(capsys)
    assert "--max-new-tokens 100,000,000,000,000,000,000,000,000,000 is more than the " in said
    assert "1,000,000 one command decodes; give fewer" in said
