"""MFU in the training log (`attnkit.train.mfu`): 6N + 12 L d_model T FLOPs a token over the
device's peak, the peak by the GPU's name or given, none on a CPU."""

import logging

import pytest
import torch

from attnkit.config import ModelConfig
from attnkit.data.batch import Batch
from attnkit.models import build_model
from attnkit.train import Trainer
from attnkit.train.meta_init import on_meta
from attnkit.train.mfu import device_peak, flops_per_token, multiplied_parameters
from attnkit.train.run_config import TrainSection
from tests.helpers import VOCAB, tiny_model, translation_batches


def test_flops_a_token_of_the_1b_shape_are_6n_plus_the_attention_term():
    config = ModelConfig.from_preset("tinyllama-1.1b")
    model = on_meta(config)
    n = multiplied_parameters(model)
    assert n == 1_100_048_384 - 32000 * 2048  # the token table is looked up, not multiplied
    assert flops_per_token(config, n, 2048) == 6 * n + 12 * 22 * 2048 * 2048


def test_a_head_tied_to_its_table_counts_once_and_learned_positions_not_at_all():
    model = build_model(ModelConfig.from_preset("gpt-tiny"))
    table = model.embed.token.weight.numel()
    positions = sum(p.numel() for n, p in model.named_parameters() if "position" in n)
    assert positions > 0
    assert multiplied_parameters(model) == model.num_parameters() - positions
    assert model.head.weight.numel() == table


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H200", 989),
        ("NVIDIA H100 80GB HBM3", 989),
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA A100-SXM4-80GB", 312),
        ("Tesla T4", None),
    ],
)
def test_the_peak_comes_from_the_gpus_name(monkeypatch, name, tflops):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    peak = device_peak(torch.device("cuda"))
    if tflops is None:
        assert peak.flops is None and "unknown" in peak.source and name in peak.source
    else:
        assert peak.flops == tflops * 1e12 and name in peak.source


def test_a_cpu_has_no_peak_unless_one_is_given():
    assert device_peak(torch.device("cpu")).flops is None
    assert device_peak(torch.device("cpu"), 2.5).flops == 2.5e12


def _lm_batches(n: int, length: int = 12) -> list[Batch]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB, (n, 4, length), generator=g)
    return [Batch(tgt=t, tgt_mask=torch.ones_like(t, dtype=torch.bool)) for t in ids]


def _settings(tmp_path, **changes) -> TrainSection:
    base = dict(steps=4, lr=3e-3, schedule="constant", warmup=0, log_every=2, device="cpu")
    return TrainSection(out_dir=str(tmp_path), threads=1, **(base | changes))


def test_the_log_reports_mfu_against_a_given_peak(tmp_path, caplog):
    model = tiny_model("decoder", positional="rope")
    n = multiplied_parameters(model)
    with caplog.at_level(logging.INFO, logger="attnkit.train"):
        result = Trainer(model, _lm_batches(4), train=_settings(tmp_path, peak_tflops=0.001)).fit()
    records = [r for r in result.history if "tokens_per_s" in r]
    assert len(records) == 2
    for r in records:
        # blocks of 12 tokens: the model reads 11 and predicts 11
        expected = r["tokens_per_s"] * flops_per_token(model.config, n, 11) / 1e9
        assert r["mfu"] == pytest.approx(expected)
    assert "6N + 12 L d_model T" in caplog.text and "0.001 TFLOP/s" in caplog.text
    assert f"MFU {100 * records[-1]['mfu']:.1f}%" in caplog.text


def test_no_mfu_on_a_cpu_without_a_peak_nor_for_an_encoder_decoder(tmp_path):
    model = tiny_model("decoder")
    result = Trainer(model, _lm_batches(2), train=_settings(tmp_path / "lm", steps=2)).fit()
    assert not any("mfu" in r for r in result.history)
    settings = _settings(tmp_path / "mt", steps=2, peak_tflops=1.0)
    result = Trainer(tiny_model(), translation_batches(2), train=settings).fit()
    assert not any("mfu" in r for r in result.history)


def test_the_chunked_cross_entropy_trains_as_the_fused_one(tmp_path):
    runs = {}
    for loss in ("fused", "chunked"):
        model = tiny_model("decoder", positional="rope")
        settings = _settings(tmp_path / loss, cross_entropy=loss, cross_entropy_chunks=3)
        trainer = Trainer(model, _lm_batches(4), train=settings)
        assert (trainer.objective.head_loss.__class__.__name__ == "partial") == (loss == "chunked")
        runs[loss] = [r["train_loss"] for r in trainer.fit().history if "train_loss" in r]
    torch.testing.assert_close(runs["chunked"], runs["fused"], rtol=1e-5, atol=1e-6)
