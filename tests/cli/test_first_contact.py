"""What a new user meets first: the version, the help texts, the progress, the device.

Each test is one snag a newcomer hit (issue 44): an error for `--version`, a description that
named 7 of 9 commands, `import hf` help naming 3 of 7 families, a help text that said
"default: 1" where the code takes torch's default, and `train.device` limited to auto/cpu/cuda.
"""

import argparse
import re

import pytest
import torch

import attnkit
from attnkit.cli import build_parser, main
from attnkit.errors import AttnkitError
from attnkit.interop import FAMILIES
from attnkit.train.run_config import RunConfig


def parsers(parser: argparse.ArgumentParser, path: str = "attnkit"):
    """Every parser of the command line with its command path, the top one first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from parsers(child, f"{path} {name}")


def test_version_prints_attnkit_torch_and_python(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"attnkit {attnkit.__version__} (torch {torch.__version__}, Python 3.")


def test_the_description_names_every_command(capsys):
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert {"demo", "train", "recipes", "embed", "serve", "import", "export"} <= set(
        commands.choices
    )
    with pytest.raises(SystemExit):
        main(["--help"])
    description = capsys.readouterr().out.split("positional arguments")[0]
    for name in commands.choices:
        assert re.search(rf"\b{name}\b", description), name


@pytest.mark.parametrize("command", [["import", "hf"], ["export", "hf"]])
def test_hf_help_lists_every_family_of_the_registry(command):
    helps = dict(parsers(build_parser()))
    assert len(FAMILIES) >= 7
    for path in (f"attnkit {command[0]}", "attnkit " + " ".join(command)):
        text = " ".join(helps[path].format_help().split())  # argparse wraps the lines
        assert all(re.search(rf"\b{family}\b", text) for family in FAMILIES), (path, text)


def test_every_option_says_what_it_does_and_its_stated_default_is_the_codes():
    seen = 0
    for path, parser in parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            name = f"{path} {'/'.join(action.option_strings) or action.dest}"
            assert action.help and len(action.help) > 8, f"{name} has no help text"
            stated = re.search(r"\(default:? (\d[\d.]*)\b", action.help)
            if stated:  # a value the help promises must be the one the parser gives
                seen += 1
                value = stated.group(1)
                number = value.count(".") < 2 and not isinstance(action.default, str)
                assert (float(value) if number else value) == action.default, name
    assert seen >= 15


@pytest.mark.parametrize("command", ["translate", "generate", "eval", "serve"])
def test_threads_help_says_torchs_default_where_the_code_leaves_it_to_torch(command):
    helps = dict(parsers(build_parser()))
    (threads,) = [a for a in helps[f"attnkit {command}"]._actions if a.dest == "threads"]
    assert threads.default == 0 and "torch's" in threads.help and "default: 1" not in threads.help


def test_train_device_takes_any_torch_device_name():
    for name in ("cpu", "cuda", "cuda:1", "mps", "xpu", "auto"):
        assert RunConfig.from_dict({"train": {"device": name}}).train.device == name
    with pytest.raises(AttnkitError, match=r"train\.device 'banana' is not a device torch knows"):
        RunConfig.from_dict({"train": {"device": "banana"}})


def test_a_device_the_machine_lacks_is_refused_before_any_work(tmp_path, capsys):
    absent = [d for d in ("cuda", "mps", "xpu") if not getattr(torch, d).is_available()]
    assert absent  # no machine has all three
    for device in absent:
        out = tmp_path / device
        code = main(
            ["train", "demo", "--set", f"train.device={device}", "--set", f"train.out_dir={out}"]
        )
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert f"train.device '{device}' is not available: torch finds no" in err
        assert not out.exists()  # stopped before the run folder was made


def test_train_runs_on_a_named_device(tmp_path):
    run = tmp_path / "run"
    sets = ["train.device=cpu:0", "train.steps=2", "eval.every=2", f"train.out_dir={run}"]
    assert main(["train", "demo", *(a for s in sets for a in ("--set", s))]) == 0
    assert (run / "model.safetensors").is_file()
