"""Bad input to the options added for billion-parameter models, each refused in one sentence:
the GPU's 8-bit compute types (`int8-weights`, `fp8`) where they cannot run, and
`train.init_on_meta`, `train.compile_scope` and `train.cross_entropy` set wrong."""

from pathlib import Path

import pytest
import torch
from torch import nn

from attnkit.cli import main
from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.nn import compute_type as ct
from attnkit.train import meta_init
from attnkit.train.run_config import TrainSection
from tests.helpers import tiny_model


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one sentence `attnkit ARGS` stops with (exit status 2), and nothing before it."""
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    *before, line = err.rstrip("\n").split("\n")
    assert line.startswith("attnkit: error: ") and not before, err
    return line.removeprefix("attnkit: error: ")


# -- the GPU's 8-bit weights ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["int8-weights", "fp8"])
def test_gpu_compute_types_on_the_cpu_are_one_sentence_from_the_command_line(
    lm_run, capsys, name
) -> None:
    args = ["generate", str(lm_run), "--prompt", "a", "--device", "cpu", "--compute-type", name]
    line = refused(capsys, *args)
    assert line == f"compute type {name!r} is for a CUDA GPU; on the CPU use int8"


def test_fp8_on_a_gpu_without_float8_tensor_cores_names_the_ones_that_have_them(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(AttnkitError, match=r"compute capability 8\.9 .*use int8-weights$"):
        ct.resolve("fp8", torch.device("cuda"))


def test_a_model_in_training_mode_is_not_given_8_bit_weights(monkeypatch):
    model = tiny_model("decoder")  # training mode, as built
    monkeypatch.setattr(ct, "refusal", lambda name, device: None)  # as on a GPU that has them
    with pytest.raises(AttnkitError, match=r"'int8-weights' is for inference: call model\.eval"):
        ct.convert(model, "int8-weights")


# -- train.init_on_meta -------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["init_from", "init_embeddings"])
def test_init_on_meta_beside_weights_read_from_files_is_refused(tmp_path: Path, source: str):
    with pytest.raises(AttnkitError, match="with init_from or init_embeddings, set it to false"):
        TrainSection(init_on_meta=True, **{source: str(tmp_path / "base")})


class _Unknown(nn.Module):
    """A module with a weight of its own and no `reset_parameters`."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))


def test_a_module_meta_initialisation_cannot_draw_is_named(monkeypatch):
    config = ModelConfig.from_preset("gpt-tiny")
    model = meta_init.on_meta(config)
    model.extra = _Unknown().to("meta")
    with pytest.raises(AttnkitError, match=r"initialise _Unknown; set train\.init_on_meta = false"):
        meta_init.materialize(model, torch.device("cpu"))


def test_a_buffer_that_cannot_be_computed_on_meta_is_named(monkeypatch):
    def with_an_empty_buffer(config: ModelConfig) -> nn.Module:
        model = tiny_model("decoder")
        model.register_buffer("table", torch.empty(4))  # torch.empty: on meta while building
        return model

    monkeypatch.setattr(meta_init, "build_model", with_an_empty_buffer)
    with pytest.raises(AttnkitError, match="the buffer table cannot be computed on the meta"):
        meta_init.on_meta(ModelConfig.from_preset("gpt-tiny"))


# -- train.compile_scope and train.cross_entropy --------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("compile_scope", "layer", "train.compile_scope 'layer' is not one of model, block"),
        ("cross_entropy", "sliced", "train.cross_entropy 'sliced' is not one of fused, chunked"),
        ("cross_entropy_chunks", 0, "train.cross_entropy_chunks"),
    ],
)
def test_the_1b_training_options_refuse_values_they_do_not_have(field, value, words):
    with pytest.raises(AttnkitError, match=words):
        TrainSection(**{field: value})
