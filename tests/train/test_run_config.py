import re
from pathlib import Path

import pytest

from attnkit import recipes
from attnkit.demo import CONFIG, demo_run_config
from attnkit.errors import AttnkitError
from attnkit.train.run_config import RunConfig

CONFIGS = recipes.FOLDER


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["demo.toml", "multi30k_de_en.toml", "tinyshakespeare_char.toml"])
def test_shipped_configs_load_and_build_a_model(name):
    config = RunConfig.load(CONFIGS / name)
    model = config.model.build(vocab_size=100)
    assert model.vocab_size == 100
    assert RunConfig.from_dict(config.to_dict()) == config


def test_the_demo_reads_the_demo_recipe():
    assert recipes.path("demo") == CONFIG
    assert RunConfig.load("demo") == demo_run_config()


def test_every_key_has_a_default_but_the_corpus():
    config = RunConfig.from_dict({})
    assert config.train.steps > 0 and config.data.task == "translation"
    assert config.data.corpus == ""  # no run learns from a corpus its config does not name


def test_toml_round_trip(tmp_path):
    config = RunConfig.load(CONFIGS / "multi30k_de_en.toml", ["train.lr=5e-4"])
    again = RunConfig.load(write(tmp_path, config.to_toml()))
    assert again == config and again.train.lr == 5e-4


def test_lora_section_reads_and_writes_pattern_lists(tmp_path):
    config = RunConfig.load(
        write(tmp_path, "[lora]\nrank = 4\n"),
        ["data.task=reverse", 'lora.targets=["*_proj", "*w_1"]'],
    )
    assert config.lora.rank == 4 and config.lora.targets == ("*_proj", "*w_1")
    assert RunConfig.load(write(tmp_path, config.to_toml())) == config


def test_overrides_are_parsed_to_the_field_type(tmp_path):
    path = write(tmp_path, "[train]\nsteps = 10\n")
    config = RunConfig.load(
        path,
        [
            "data.task=translation",
            "train.steps=20",
            "train.lr=3",
            "train.compile=true",
            "data.corpus=my_corpus",
            "model.d_model=64",
            'eval.metric="bleu"',
        ],
    )
    assert config.train.steps == 20
    assert config.train.lr == 3.0 and isinstance(config.train.lr, float)
    assert config.train.compile is True
    assert config.data.corpus == "my_corpus"
    assert config.model.overrides == {"d_model": 64}
    assert config.eval.metric == "bleu"


@pytest.mark.parametrize(
    ("text", "overrides", "message"),
    [
        ("[train]\nstesp = 10\n", [], "unknown key 'train.stesp'; did you mean 'train.steps'"),
        ("[trian]\nsteps = 10\n", [], "unknown section 'trian'; did you mean 'train'"),
        ("[model]\nd_modle = 64\n", [], "did you mean 'model.d_model'"),
        ("", ["train.warmpu=5"], "did you mean 'train.warmup'"),
        ('[train]\nsteps = "ten"\n', [], "train.steps must be int, got 'ten'"),
        ("", ["train.steps=1.5"], "train.steps must be int, got 1.5"),
        ("", ["train.compile=yes"], "train.compile must be bool, got 'yes'"),
        ("", ["train.lr=-1"], "train.lr must be positive"),
        ("", ["train.schedule=cosin"], "train.schedule 'cosin' is not one of"),
        ("", ["train.precision=fp8"], "train.precision 'fp8' is not one of"),
        ("", ["data.task=summarise"], "data.task 'summarise' is not one of"),
        ("", ["model.preset=paper-bse"], "did you mean 'paper-base'"),
        ("", ["train.average_last=5"], "raise train.keep_last"),
        ("", ["train.decay_over=hours"], "train.decay_over 'hours' is not one of"),
        (
            "",
            ["train.decay_over=minutes", "train.schedule=cosine"],
            "train.decay_over 'minutes' needs train.max_minutes > 0",
        ),
        (
            "",
            ["train.decay_over=minutes", "train.max_minutes=5"],
            "not 'inverse-sqrt'",
        ),
        ("", ["trainsteps=5"], "is not section.key=value"),
        ("[train\n", [], "is not valid TOML"),
        ("", ["lora.rank=-1"], "lora.rank must be zero or more"),
        ("", ["lora.targets=[]"], "lora.targets must name at least one pattern"),
        ("", ["lora.targets=3"], "lora.targets must be a list of strings, got 3"),
        ("", ["train.lr=nan"], "train.lr must be a finite number, got nan"),
        ("", ["model.rope_theta=inf"], "model.rope_theta must be a finite number, got inf"),
        ("beta2 = 0.9\n", [], "the key 'beta2' comes before any [section] header"),
        ("[model]\nvocab_size = 9\n", [], "model.vocab_size comes from the tokenizer"),
        ("[train]\nsteps = 10\n", [], "run.toml names no data.task; a run config needs"),
    ],
)
def test_bad_configs_stop_with_one_sentence(tmp_path, text, overrides, message):
    with pytest.raises(AttnkitError, match=re.escape(message)) as err:
        RunConfig.load(write(tmp_path, text), overrides)
    assert "\n" not in str(err.value)


def test_model_fields_are_checked_by_model_config():
    config = RunConfig.from_dict({"model": {"d_model": 30, "n_heads": 4}})
    with pytest.raises(AttnkitError, match="not divisible by n_heads"):
        config.model.build()


def test_missing_file():
    with pytest.raises(AttnkitError, match="no run config at"):
        RunConfig.load("nowhere.toml")
