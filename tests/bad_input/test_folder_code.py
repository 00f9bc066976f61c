"""A run folder never runs code: a pre-tokenization rule its tokenizer.pretokenize.json names
(`module:function`) is imported only when the user names it (`--allow-rule`, `allow_rules`),
attnkit's own rules load by themselves, and the served path never imports one."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnkit import AttnkitError
from attnkit.cli import main
from attnkit.pretokenize import PretokenizeConfig, Pretokenizer
from attnkit.run import RunFolder, load_run
from attnkit.serve.runs import served_runs
from attnkit.tokenizer import Tokenizer
from tests.helpers import tiny_run


def run_naming(path: Path, rule: str) -> Path:
    """A language-model run folder whose tokenizer's pre-tokenization names `rule`, made
    without importing it (the folder as someone else would hand it over)."""
    tiny_run(path, "decoder")
    folder = RunFolder(path)
    tokenizer = Tokenizer.load(folder.tokenizer)
    tokenizer.pretokenizer = Pretokenizer(PretokenizeConfig(rule=rule), rule=lambda text: text)
    tokenizer.save(folder.tokenizer)
    return path


def test_a_folder_naming_a_shell_command_runs_nothing(tmp_path: Path, capsys) -> None:
    run = run_naming(tmp_path / "run", "subprocess:getoutput")
    marker = tmp_path / "ran"
    prompt = f"touch {marker}"
    assert main(["generate", str(run), "--prompt", prompt, "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert not marker.exists()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert (
        "names the pre-tokenization rule 'subprocess:getoutput', code outside attnkit that "
        "loading a run never imports on its own; if you trust it, pass --allow-rule "
        "subprocess:getoutput to translate, generate or eval"
    ) in err
    with pytest.raises(AttnkitError, match="never imports on its own"):
        load_run(run)
    with pytest.raises(AttnkitError, match="attnkit serve never does"):
        served_runs([str(run)])
    assert main(["serve", str(run), "--port", "0"]) == 2
    assert "which attnkit serve never does" in capsys.readouterr().err
    assert not marker.exists()


def test_a_users_rule_loads_when_named(tmp_path: Path, capsys) -> None:
    run = run_naming(tmp_path / "run", "tests.helpers:hashtags_apart")
    with pytest.raises(AttnkitError, match=r"--allow-rule tests\.helpers:hashtags_apart"):
        load_run(run)
    with pytest.raises(AttnkitError, match="never imports on its own"):
        load_run(run, allow_rules=["tests.helpers:other"])
    loaded = load_run(run, allow_rules=["tests.helpers:hashtags_apart"])
    assert loaded.tokenizer.pretokenizer.text("#a b") == "# a b"
    args = ["generate", str(run), "--prompt", "ab", "--max-new-tokens", "2", "--greedy"]
    assert main([*args, "--allow-rule", "tests.helpers:hashtags_apart"]) == 0
    capsys.readouterr()


def test_attnkits_own_rules_load_unasked(tmp_path: Path) -> None:
    run = run_naming(tmp_path / "run", "lowercase")
    assert load_run(run).tokenizer.pretokenizer.text("AbC") == "abc"
    with pytest.raises(AttnkitError, match="must be one of lowercase, nfc, nfkc or name a"):
        PretokenizeConfig(rule="upper")


def test_a_rule_that_returns_no_text_is_refused_in_one_sentence(tmp_path: Path) -> None:
    p = Pretokenizer(PretokenizeConfig(rule="builtins:len"))
    with pytest.raises(AttnkitError, match=r"pretokenize.rule 'builtins:len' returned int 3 for "
                       "a text; a rule takes a text and returns the text rewritten"):  # fmt: skip
        p.text("abc")
