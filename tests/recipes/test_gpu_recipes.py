"""The GPU recipes for Multi30k and CMUdict: their CPU recipes with the settings their comments
name changed, and a step of bench/gpu_checks.sh each."""

from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from attnkit import recipes
from attnkit.train.run_config import RunConfig

ROOT = Path(__file__).resolve().parents[2]

# What each GPU recipe changes in its CPU recipe; its comments say why, the rest is measured
# as the CPU recipe ships it (docs/results/real-data.md, docs/results/g2p.md).
CHANGED = {
    ("multi30k_de_en_gpu", "multi30k_de_en"): {
        "model": {"d_model", "n_encoder_layers", "n_decoder_layers", "d_ff", "dropout",
                  "embedding_dropout", "attention_dropout", "activation_dropout"},
        "train": {"out_dir", "device", "steps", "max_minutes", "lr", "warmup", "log_every"},
        "eval": {"every"},
    },
    ("cmudict_g2p_gpu", "cmudict_g2p"): {
        "data": {"max_tokens"},
        "train": {"out_dir", "device", "steps", "max_minutes", "log_every", "save_every"},
        "eval": {"every"},
    },
}  # fmt: skip


def settings(name: str) -> dict[str, dict]:
    return tomllib.loads(recipes.path(name).read_text(encoding="utf-8"))


def changed(a: dict[str, dict], b: dict[str, dict]) -> dict[str, set[str]]:
    found = {}
    for section in a.keys() | b.keys():
        x, y = a.get(section, {}), b.get(section, {})
        keys = {key for key in x.keys() | y.keys() if x.get(key) != y.get(key)}
        if keys:
            found[section] = keys
    return found


@pytest.mark.parametrize(("gpu", "cpu"), list(CHANGED), ids=lambda name: name)
def test_a_gpu_recipe_changes_only_what_its_comments_account_for(gpu, cpu):
    assert changed(settings(gpu), settings(cpu)) == CHANGED[gpu, cpu]
    config = RunConfig.load(gpu)
    assert config.train.device == "cuda" and config.train.decay_over == "minutes"
    assert config.train.max_minutes <= 10  # the bound for a lent GPU
    assert config.train.average_last == config.train.keep_last == 5


def test_the_two_multi30k_gpu_recipes_differ_only_in_direction():
    de_en, en_de = settings("multi30k_de_en_gpu"), settings("multi30k_en_de_gpu")
    assert changed(de_en, en_de) == {"data": {"src_lang", "tgt_lang"}, "train": {"out_dir"}}
    assert (en_de["data"]["src_lang"], en_de["data"]["tgt_lang"]) == ("en", "de")


@pytest.mark.parametrize("name", ["multi30k_de_en_gpu", "multi30k_en_de_gpu", "cmudict_g2p_gpu"])
def test_each_gpu_recipe_has_a_gpu_check_and_a_howto_entry(name):
    script = (ROOT / "bench" / "gpu_checks.sh").read_text(encoding="utf-8")
    steps = [line for line in script.splitlines() if line.strip().endswith(")")]
    assert any(name in line.split("|") or f" {name} " in f" {line.strip()[:-1]} " for line in steps)
    assert f"gpu_checks.sh {name}" in (ROOT / "docs" / "results" / "gpu.md").read_text()
    assert name in (ROOT / "docs" / "howto" / "recipes.md").read_text()
