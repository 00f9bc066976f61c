"""Bad run configs stop in one sentence before any work starts: the file's encoding and
layout, what a config must name, finite numbers, the run folder's path, the rules across
sections (task, metric, model), and hints that name only options and keys that exist."""

from __future__ import annotations

import ast
import gzip
import math
import os
import re
import sys
import typing
import urllib.error
from fnmatch import fnmatch
from pathlib import Path

import pytest

import attnkit
from attnkit.cli import build_parser, main
from attnkit.config import ModelConfig
from attnkit.data import corpora
from attnkit.errors import AttnkitError
from attnkit.run import WEIGHTS_FILE
from attnkit.tokenizer import Tokenizer
from attnkit.train.run_config import SECTIONS, RunConfig, TrainSection
from attnkit.train.tasks import train

# A character language model small enough to train in a moment, on `corpus`, into `out_dir`.
LM_CONFIG = """
[model]
preset = "gpt-tiny"
d_model = 16
n_heads = 2
d_ff = 32
n_decoder_layers = 1
max_len = 16

[data]
task = "language-model"
corpus = "{corpus}"
tokenizer = "char"
block_size = 8
batch_size = 2

[train]
out_dir = "{out_dir}"
steps = 2
threads = 1
"""
REVERSE = '[data]\ntask = "reverse"\n[model]\npreset = "demo"\n[eval]\nmetric = "exact_match"\n'


def write(folder: Path, text: str, name: str = "run.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def lm_config(folder: Path, *, out_dir: str | Path | None = None, text: str = "") -> Path:
    """A language-model run config and its corpus in `folder`; `out_dir` is `folder`/run."""
    corpus = write(folder, text or "to be or not to be, that is the question\n" * 20, "text.txt")
    out_dir = out_dir if out_dir is not None else folder / "run"
    return write(folder, LM_CONFIG.format(corpus=corpus, out_dir=out_dir))


def refused(capsys: pytest.CaptureFixture[str], *args: str, started: bool = False) -> str:
    """The one sentence `attnkit ARGS` stops with (exit status 2), all it prints unless the
    run had `started` (its progress bar drawn) before the mistake could be seen."""
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    *before, line = err.rstrip("\n").split("\n")
    assert line.startswith("attnkit: error: ") and (started or not before), err
    return line.removeprefix("attnkit: error: ")


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training a tokenizer fails the test: a refusal must come before any work."""

    def trained(cls, *args, **kwargs):
        pytest.fail("the tokenizer was trained before the config was refused")

    monkeypatch.setattr(Tokenizer, "train", classmethod(trained))


@pytest.fixture
def offline(isolated_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No corpus in the cache and no network: a missing corpus is never downloaded."""

    def no_network(url: str, timeout: float) -> None:
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(corpora, "urlopen", no_network)


# -- the file ---------------------------------------------------------------------------------


def test_a_run_config_that_is_not_utf8_is_named_with_its_line(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_bytes(b'[data]\ntask = "reverse"\n# caf\xe9 latin-1\n')
    message = refused(capsys, "train", str(path))
    assert message.startswith(f"{path} line 3 is not valid UTF-8 (byte 5 of the line)")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("lr = 1e-3\n[train]\nsteps = 5\n", "[train]"),
        ("dropout = 0.1\n", "[model] or [lora]"),
        ("max_len = 64\n", "[model] or [data]"),
        ("vocab_size = 64\n", "[data]"),  # [model] may not set it
        (
            "temperature = 0.5\n",
            "[scheduled_sampling] or [sequence_loss] or [ppo] or [pairs] or [embedding]",
        ),
        (
            "speed = 1\n",
            "the section it belongs to, one of [model], [data], [train], [eval], [lora], "
            "[adapters], [scheduled_sampling], [sequence_loss], [guided_attention], [dpo], "
            "[segment_recurrence], [ppo], [pairs], [embedding], [word2vec], [glove], "
            "[pretokenize]",
        ),
        ("beta = 0.1\n", "[dpo] or [ppo]"),
        ("x_max = 10\n", "[glove]"),
        ("phrases = 2\n", "[pretokenize]"),
        ("width = 0.3\n", "[guided_attention]"),
    ],
)
def test_a_key_before_any_section_header_names_the_section_it_belongs_to(
    tmp_path, capsys, text, where
):
    key = text.partition(" ")[0]
    assert refused(capsys, "train", str(write(tmp_path, text))) == (
        f"the key {key!r} comes before any [section] header, but every key belongs to a "
        f"section; put it under {where}"
    )


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("", "holds no settings"),
        ("# nothing yet\n", "holds no settings"),
        ("[train]\nsteps = 5\n", "names no data.task"),
    ],
)
def test_an_empty_run_config_is_refused_with_what_a_config_needs(
    tmp_path, capsys, monkeypatch, offline, no_work, text, what
):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, text)
    message = refused(capsys, "train", str(path))
    assert message.startswith(f"{path} {what}; a run config needs at least [data] task (one of ")
    assert list(tmp_path.iterdir()) == [path]  # no run folder, nothing downloaded


def test_a_text_task_without_a_corpus_is_refused_rather_than_given_multi30k(
    tmp_path, capsys, offline, no_work
):
    path = write(tmp_path, '[data]\ntask = "translation"\n')
    expected = "data.task 'translation' learns from text, but data.corpus is not set"
    assert refused(capsys, "train", str(path)).startswith(expected)
    with pytest.raises(AttnkitError, match=expected):
        train(RunConfig.from_dict({"data": {"task": "translation"}}))


# -- numbers ----------------------------------------------------------------------------------


def _float_keys() -> list[str]:
    """Every key of the run config that holds a float, [model]'s ModelConfig fields included."""
    sections = {name: cls for name, cls in SECTIONS.items() if name != "model"}
    sections["model"] = ModelConfig
    return [
        f"{name}.{key}"
        for name, cls in sections.items()
        for key, hint in typing.get_type_hints(cls).items()
        if hint is float
    ]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", _float_keys())
def test_every_float_key_must_be_a_finite_number(tmp_path, key, value):
    with pytest.raises(AttnkitError, match=rf"^{key} must be a finite number, got -?(nan|inf)$"):
        RunConfig.load(write(tmp_path, REVERSE), [f"{key}={value}"])


def test_lr_nan_in_the_file_or_the_python_api_must_be_a_finite_number(tmp_path):
    path = write(tmp_path, REVERSE + "[train]\nlr = nan\n")
    with pytest.raises(AttnkitError, match=r"^train\.lr must be a finite number, got nan$"):
        RunConfig.load(path)
    with pytest.raises(AttnkitError, match=r"^train\.lr must be a finite number, got nan$"):
        TrainSection(lr=math.nan)
    with pytest.raises(AttnkitError, match=r"^dropout must be a finite number, got inf$"):
        ModelConfig(dropout=math.inf)


# -- the run folder ---------------------------------------------------------------------------


def test_an_out_dir_that_is_a_file_is_refused_before_the_tokenizer_is_trained(
    tmp_path, capsys, no_work
):
    taken = write(tmp_path, "notes", "notes.txt")
    path = lm_config(tmp_path, out_dir=taken)
    assert refused(capsys, "train", str(path)) == (
        f"train.out_dir {str(taken)!r} is a file, not a folder; choose another train.out_dir"
    )
    with pytest.raises(AttnkitError, match="is a file, not a folder"):
        train(RunConfig.load(path))  # the Python API checks as early
    path = lm_config(tmp_path, out_dir=taken / "run")
    assert refused(capsys, "train", str(path)) == (
        f"train.out_dir {str(taken / 'run')!r} cannot be made, because {str(taken)!r} is a "
        "file; choose another train.out_dir"
    )
    assert taken.read_text() == "notes"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_an_out_dir_that_cannot_be_written_is_refused_before_the_tokenizer_is_trained(
    tmp_path, capsys, no_work
):
    # Nobody, root included, may create files in /proc.
    path = lm_config(tmp_path, out_dir="/proc/attnkit/run")
    assert refused(capsys, "train", str(path)) == (
        "train.out_dir '/proc/attnkit/run' cannot be written, because '/proc' is not writable; "
        "choose a train.out_dir in a folder you can write to"
    )


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere")
def test_an_out_dir_in_a_read_only_folder_is_refused_before_the_tokenizer_is_trained(
    tmp_path, capsys, no_work
):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    path = lm_config(tmp_path, out_dir=locked / "run")
    assert "is not writable" in refused(capsys, "train", str(path))


# -- rules across sections --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task", "metric", "allowed"),
    [
        ("language-model", "bleu", "val_loss, val_ppl"),
        ("reverse", "val_loss", "exact_match"),
        ("translation", "exact_match", "val_loss, val_ppl, bleu, per, wer"),
    ],
)
def test_a_metric_the_task_does_not_compute_is_refused_before_any_work(
    tmp_path, capsys, no_work, task, metric, allowed
):
    path = lm_config(tmp_path)
    settings = ["--set", f"data.task={task}", "--set", f"eval.metric={metric}"]
    assert refused(capsys, "train", str(path), *settings) == (
        f"eval.metric {metric!r} is not computed for data.task {task!r}; choose one of {allowed}"
    )


def test_train_validates_the_whole_config_as_the_command_does(tmp_path, no_work):
    config = RunConfig.load(lm_config(tmp_path), ["eval.metric=bleu"])
    with pytest.raises(AttnkitError, match=r"eval\.metric 'bleu' is not computed"):
        train(config)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "model.preset=tiny",
            "data.task 'language-model' trains a decoder model, but the [model] section "
            "describes an encoder-decoder one; set model.shape or choose another preset",
        ),
        ("data.block_size=32", "data.block_size 32 is over model.max_len 16"),
        ("model.n_heads=3", "d_model 16 is not divisible by n_heads 3"),
        ("train.init_from=nowhere", "train.init_from 'nowhere' is not an attnkit run folder"),
    ],
)
def test_the_model_a_config_describes_is_checked_before_any_work(
    tmp_path, capsys, no_work, setting, message
):
    assert refused(capsys, "train", str(lm_config(tmp_path)), "--set", setting).startswith(message)


@pytest.mark.parametrize("key", ["vocab_size", "src_vocab_size"])
def test_model_vocab_size_is_refused_since_the_tokenizer_sets_it(tmp_path, capsys, key):
    message = refused(capsys, "train", str(lm_config(tmp_path)), "--set", f"model.{key}=500")
    assert message == (
        f"model.{key} comes from the tokenizer, so the [model] section cannot set it; remove it "
        "(data.vocab_size is the size a new tokenizer is trained to)"
    )


# -- hints --------------------------------------------------------------------------------------

# The modules that hold the logic of one command.
# Keyed by a folder of the package or a module's path in it.
COMMAND_OF = {"train": "train", "evaluation/run.py": "eval", "demo.py": "demo"}
MESSAGE_CALLS = {"AttnkitError", "check", "warning", "info", "error", "warn", "print"}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*")
# section.key, not a file (model.safetensors is WEIGHTS_FILE) or a call (model.state_dict()).
KEY = re.compile(r"(?<![\w./])(model|data|train|eval|lora)\.([\w*]+)(?![\w/(])")


def _messages(path: Path) -> list[str]:
    """The text of each message `path` raises, checks, logs or prints (an f-string's literal
    parts joined by NUL, where its values go)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in MESSAGE_CALLS:
                parts = [n for arg in node.args for n in ast.walk(arg)]
                found.append(
                    "".join(
                        n.value
                        if isinstance(n, ast.Constant) and isinstance(n.value, str)
                        else "\0"
                        for n in parts
                        if isinstance(n, ast.Constant | ast.FormattedValue)
                    )
                )
    return found


def _subcommands(parser) -> dict:
    """The parsers of the subcommands of `parser`, by name."""
    return next((a.choices for a in parser._actions if isinstance(a.choices, dict)), {})


def _options(parser) -> set[str]:
    """Every option string of `parser` and of its subcommands, all the way down."""
    options = {option for action in parser._actions for option in action.option_strings}
    for sub in _subcommands(parser).values():
        options |= _options(sub)
    return options


def test_every_option_and_key_a_message_names_exists():
    parser = build_parser()
    commands = _subcommands(parser)
    keys = {f"model.{k}" for k in ["preset", *typing.get_type_hints(ModelConfig)]}
    keys |= {
        f"{s}.{k}"
        for s, cls in SECTIONS.items()
        if s != "model"
        for k in typing.get_type_hints(cls)
    }
    package = Path(attnkit.__file__).parent
    wrong = []
    for path in sorted(package.rglob("*.py")):
        # The logic of one command may name only that command's options; what several
        # commands share, any command's.
        relative = path.relative_to(package).as_posix()
        command = COMMAND_OF.get(path.parent.name) or COMMAND_OF.get(relative)
        flags = _options(commands[command] if command else parser)
        for message in _messages(path):
            wrong += [f"{path.name}: {f}" for f in FLAG.findall(message) if f not in flags]
            for section, key in KEY.findall(message):
                name = f"{section}.{key}"
                if name != WEIGHTS_FILE and not any(fnmatch(k, name) for k in keys):
                    wrong.append(f"{path.name}: {name}")
    assert not wrong


def test_missing_corpus_files_of_a_run_name_data_data_dir_not_a_flag_train_lacks(
    tmp_path, capsys, offline
):
    empty = tmp_path / "empty"
    empty.mkdir()
    path = write(
        tmp_path,
        f'[data]\ntask = "translation"\ncorpus = "multi30k"\n'
        f'data_dir = "{empty}"\n[train]\nout_dir = "{tmp_path / "run"}"\n',
    )
    message = refused(capsys, "train", str(path), started=True)
    assert message.endswith(
        f"put them in {empty / 'multi30k'}/ and set data.data_dir to {empty} "
        "(or set $ATTNKIT_DATA to the folder holding multi30k/)"
    )
    assert "--data-dir" not in message


def test_a_run_without_data_dir_searches_no_developer_folder_and_names_the_key(
    tmp_path, capsys, offline, monkeypatch
):
    # ../shared/data beside the working folder holds the corpus, as on a developer's machine:
    # only data.data_dir (or $ATTNKIT_DATA) may point there.
    shared = tmp_path / "work" / "shared" / "data" / "multi30k"
    shared.mkdir(parents=True)
    for lang in ("de", "en"):
        (shared / f"train.{lang}.gz").write_bytes(gzip.compress(b"ein hund\n"))
    (tmp_path / "work" / "repo").mkdir()
    monkeypatch.chdir(tmp_path / "work" / "repo")
    path = write(
        tmp_path,
        '[data]\ntask = "translation"\ncorpus = "multi30k"\n'
        f'[train]\nout_dir = "{tmp_path / "run"}"\n',
    )
    message = refused(capsys, "train", str(path), started=True)
    assert message.startswith("multi30k needs train.de.gz, train.en.gz, which are not in ")
    assert message.endswith(
        "put them in DIR/multi30k/ and set data.data_dir to DIR "
        "(or set $ATTNKIT_DATA to the folder holding multi30k/)"
    )


def test_a_language_model_text_too_short_for_its_split_names_the_config_keys(tmp_path, capsys):
    path = lm_config(tmp_path, text="to be or not to be\n" * 2)
    message = refused(capsys, "train", str(path), started=True)
    assert message.endswith("lower data.block_size or change data.valid_fraction")


# -- guided attention -----------------------------------------------------------------------------

# A translation run of the "tiny" preset (two decoder layers of four heads); never trained here.
GUIDED = '[model]\npreset = "tiny"\n[data]\ntask = "translation"\ncorpus = "multi30k"\n'


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            ["data.task=language-model", "model.preset=gpt-tiny"],
            "[guided_attention] guides the cross-attention of a translation model, which "
            "data.task 'language-model' does not train; use it with data.task 'translation' "
            "or set guided_attention.weight = 0",
        ),
        (
            ["data.task=reverse", "model.preset=demo", "eval.metric=exact_match"],
            "[guided_attention] guides the cross-attention of a translation model, which "
            "data.task 'reverse' does not train",
        ),
        (
            ["scheduled_sampling.decay=constant", "scheduled_sampling.k=0.5"],
            "[guided_attention] and [scheduled_sampling] do not combine; train with guided "
            "attention, then fine-tune with the other (train.init_from)",
        ),
        (
            ["sequence_loss.kind=self-critical"],
            "[guided_attention] and [sequence_loss] do not combine",
        ),
        (
            ["guided_attention.layers=2"],
            "guided_attention.layers 2 is out of range for model.n_decoder_layers = 2; "
            "use 0 to 1, or -2 to -1 counting from the end",
        ),
        (
            ["guided_attention.heads=0,4"],
            "guided_attention.heads 4 is out of range for model.n_heads = 4; use 0 to 3, "
            "or -4 to -1 counting from the end",
        ),
        (
            ["model.n_decoder_layers=1", "guided_attention.layers=0,-1"],
            "guided_attention.layers names index 0 twice (once from the end); name it once",
        ),
        (
            ["guided_attention.layers=first"],
            "guided_attention.layers must be 'all' or 'last', an index or indices separated by "
            "commas such as '0,2'; got 'first'",
        ),
        (
            ["model.copy_attention=mean"],
            "[guided_attention] trains through the plain output layer, which a "
            "pointer-generator (model.copy_attention) replaces",
        ),
    ],
)
def test_guided_attention_is_refused_where_it_cannot_train(
    tmp_path, capsys, no_work, settings, message
):
    path = write(tmp_path, GUIDED + f'[train]\nout_dir = "{tmp_path / "run"}"\n')
    sets = [item for s in ["guided_attention.weight=1", *settings] for item in ("--set", s)]
    assert refused(capsys, "train", str(path), *sets).startswith(message)


# -- values out of a library's range get attnkit's sentence, not torch's (issue 39, POOR) -------


@pytest.mark.parametrize("value", [-1, 2**32, 2**70])
def test_a_seed_out_of_range_is_one_sentence_before_torch_or_numpy_sees_it(value, lm_run, capsys):
    from attnkit.generation import GenerationConfig
    from attnkit.train import RunConfig

    sentence = f"must be a whole number from 0 to 4294967295, not {value!r}"
    with pytest.raises(AttnkitError, match=rf"^train\.seed {re.escape(sentence)}$"):
        RunConfig.from_dict({"train": {"seed": value}})
    with pytest.raises(AttnkitError, match=rf"^seed {re.escape(sentence)}$"):
        GenerationConfig(seed=value)
    args = ["generate", str(lm_run), "--prompt", "a", "--temperature", "0.8"]
    assert main([*args, "--seed", str(value)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"attnkit: error: seed {sentence}"


def test_a_relative_data_dir_is_named_as_the_folder_it_was_read_from(
    tmp_path, capsys, offline, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    path = write(
        tmp_path,
        '[data]\ntask = "translation"\ncorpus = "multi30k"\ndata_dir = "../shared/data"\n'
        f'[train]\nout_dir = "{tmp_path / "run"}"\n',
    )
    message = refused(capsys, "train", str(path), started=True)
    where = tmp_path.parent / "shared" / "data"  # normalized: the folder "../" names
    assert f"which are not in {where}," in message
    assert f"put them in {where / 'multi30k'}/ and set data.data_dir to {where} " in message
