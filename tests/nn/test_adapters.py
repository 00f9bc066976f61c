"""Houlsby adapters: the base model at the start, only adapters train, saved with and apart."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from attnkit.errors import AttnkitError
from attnkit.nn.adapters import Adapter, adapter_state_dict, apply_adapters
from attnkit.run import ADAPTERS_FILE, load_pretrained, save_pretrained
from attnkit.train.run_config import RunConfig
from tests.helpers import tiny_model

IDS = torch.randint(5, 24, (2, 6))


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS, IDS).logits


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_a_model_with_new_adapters_computes_exactly_what_its_base_did(norm_position: str):
    model = tiny_model("encoder-decoder", norm_position=norm_position).eval()
    before = logits(model)
    assert apply_adapters(model, 4) == 5  # encoder: self, FFN; decoder: self, cross, FFN
    assert torch.equal(logits(model), before)
    assert model.config.adapter_size == 4


def test_only_the_adapters_train_and_they_change_the_output():
    model = tiny_model("encoder-decoder", dropout=0.0, embedding_dropout=0.0)
    apply_adapters(model, 4)
    frozen = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("adapter." in n for n in trainable)
    # 2 m d + m + d per adapter: m = 4, d = 16.
    assert model.num_parameters(trainable_only=True) == 5 * (2 * 4 * 16 + 4 + 16)
    before = logits(model.eval())
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(3):
        loss = model(IDS, IDS).logits.logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert not torch.allclose(logits(model.eval()), before)


def test_a_run_folder_keeps_the_adapters_and_writes_them_alone(tmp_path):
    model = tiny_model("encoder-decoder").eval()
    apply_adapters(model, 3)
    for adapter in (m for m in model.modules() if isinstance(m, Adapter)):
        torch.nn.init.normal_(adapter.up.weight, std=0.1)  # as if trained
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path)
    assert loaded.config.adapter_size == 3
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)
    alone = load_file(str(tmp_path / ADAPTERS_FILE))
    assert alone.keys() == adapter_state_dict(model).keys() and alone


def test_adapters_are_refused_twice_or_empty():
    model = tiny_model("encoder-decoder")
    with pytest.raises(AttnkitError, match="at least 1"):
        apply_adapters(model, 0)
    apply_adapters(model, 2)
    with pytest.raises(AttnkitError, match="already has adapters"):
        apply_adapters(model, 2)


def test_a_run_config_has_an_adapters_section(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[data]\ntask = "reverse"\n[adapters]\nsize = 8\n')
    assert RunConfig.load(path).adapters.size == 8
    with pytest.raises(AttnkitError, match=r"adapters\.size"):
        RunConfig.load(path, ["adapters.size=-1"])


def test_lora_and_adapters_are_not_combined(tmp_path):
    from attnkit.train.tasks import build_task

    path = tmp_path / "run.toml"
    path.write_text(
        '[data]\ntask = "reverse"\n[eval]\nmetric = "exact_match"\n'
        "[lora]\nrank = 2\n[adapters]\nsize = 4\n"
    )
    with pytest.raises(AttnkitError, match="choose one of them"):
        build_task(RunConfig.load(path, [f"train.out_dir={tmp_path / 'out'}"]))
