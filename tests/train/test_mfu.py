"""MFU in the training log (`attnkit.train.mfu`): 6N + 12 L d_model T FLOPs a token over the
device's peak (an encoder-decoder's counted a side at a time, cross-attention included), the
peak by the GPU's name or given, none on a CPU."""

import logging

import pytest
import torch

from attnkit.config import ModelConfig
from attnkit.data.batch import Batch
from attnkit.errors import AttnkitError
from attnkit.models import build_model
from attnkit.train import Trainer
from attnkit.train.meta_init import on_meta
from attnkit.train.mfu import (
    MFU,
    device_peak,
    encoder_decoder_flops,
    flops_per_token,
    multiplied_parameters,
    parameters_by_side,
)
from attnkit.train.run_config import TrainSection
from tests.helpers import VOCAB, tiny_config, tiny_model, translation_batches


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


def test_no_mfu_on_a_cpu_without_a_peak(tmp_path):
    model = tiny_model("decoder")
    result = Trainer(model, _lm_batches(2), train=_settings(tmp_path / "lm", steps=2)).fit()
    assert not any("mfu" in r for r in result.history)
    result = Trainer(tiny_model(), translation_batches(2), train=_settings(tmp_path / "mt")).fit()
    assert not any("mfu" in r for r in result.history)


# The tiny encoder-decoder (d_model 16, 2 heads of 8, d_ff 32, one layer a side, biases, post-LN,
# every table tied to the head, vocabulary 24), counted by hand:
#   an encoder layer: qkv 48x16+48 = 816, out 16x16+16 = 272, norm 32, w_1 32x16+32 = 544,
#     w_2 16x32+16 = 528, norm 32: 2,224; a cross-attention's kv 32x16+32 = 544 reads the
#     source too: N_src = 2,768
#   the decoder: self-attention 816 + 272 + 32 = 1,120; cross-attention's q 272, out 272,
#     norm 32 = 576; feed-forward 544 + 528 + 32 = 1,104; the head 24x16 = 384: N_tgt = 3,184
N_SRC, N_TGT = 2_768, 3_184


def test_an_encoder_decoders_weights_split_by_the_side_whose_tokens_they_multiply():
    model = tiny_model()
    assert parameters_by_side(model) == (N_SRC, N_TGT)
    assert sum(parameters_by_side(model)) == multiplied_parameters(model)


def test_an_encoder_decoders_flops_are_each_sides_count_with_cross_attention():
    config = tiny_config("encoder-decoder")
    # 10 real source tokens over S = 5 positions, 7 real target tokens over T = 4:
    #   source: 10 x (6 x 2,768 + 12 x 1 x 16 x 5) = 10 x 17,568 = 175,680
    #   target: 7 x (6 x 3,184 + 12 x 1 x 16 x (4 + 5)) = 7 x 20,832 = 145,824
    flops = encoder_decoder_flops(config, (N_SRC, N_TGT), (10, 7), (5, 4))
    assert flops == 175_680 + 145_824


def test_mfu_adds_an_encoder_decoders_batches_by_their_real_tokens():
    model = tiny_model()
    mfu = MFU(model, torch.device("cpu"), devices=2, given=1e-6)  # 1 MFLOP/s a device
    batches = translation_batches(2)
    expected, targets = 0.0, 0
    for batch in batches:
        mfu.add(batch)
        s, t = batch.src.shape[1], batch.tgt.shape[1] - 1
        src_tokens, tgt_tokens = int(batch.src_mask.sum()), int(batch.tgt_mask[:, 1:].sum())
        expected += src_tokens * (6 * N_SRC + 12 * 16 * s)
        expected += tgt_tokens * (6 * N_TGT + 12 * 16 * (t + s))
        targets += tgt_tokens
    assert mfu.of(100.0, length=0) == pytest.approx(100.0 * expected / targets / 2e6)
    assert mfu.of(100.0, length=0) is None  # the interval's count starts again


def test_the_log_reports_an_encoder_decoders_mfu(tmp_path, caplog):
    model = tiny_model(dropout=0.0)
    batches = translation_batches(4)
    settings = _settings(tmp_path, peak_tflops=0.001, log_every=2)
    with caplog.at_level(logging.INFO, logger="attnkit.train"):
        result = Trainer(model, batches, train=settings).fit()
    records = [r for r in result.history if "tokens_per_s" in r]
    assert len(records) == 2
    for r, pair in zip(records, (batches[:2], batches[2:]), strict=True):
        flops = sum(
            encoder_decoder_flops(
                model.config,
                (N_SRC, N_TGT),
                (int(b.src_mask.sum()), int(b.tgt_mask[:, 1:].sum())),
                (b.src.shape[1], b.tgt.shape[1] - 1),
            )
            for b in pair
        )
        targets = sum(int(b.tgt_mask[:, 1:].sum()) for b in pair)
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * flops / targets / 1e9)
    assert "12 L_d d (T + S)" in caplog.text
    assert f"MFU {100 * records[-1]['mfu']:.1f}%" in caplog.text


@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_the_chunked_cross_entropy_trains_as_the_fused_one(tmp_path, shape):
    runs = {}
    for loss in ("fused", "chunked"):
        model = tiny_model(shape, positional="rope", dropout=0.0)
        batches = _lm_batches(4) if shape == "decoder" else translation_batches(4)
        settings = _settings(tmp_path / loss, cross_entropy=loss, cross_entropy_chunks=3)
        trainer = Trainer(model, batches, train=settings)
        assert (trainer.objective.head_loss.__class__.__name__ == "partial") == (loss == "chunked")
        runs[loss] = [r["train_loss"] for r in trainer.fit().history if "train_loss" in r]
    torch.testing.assert_close(runs["chunked"], runs["fused"], rtol=1e-5, atol=1e-6)


def test_a_chunked_cross_entropy_for_a_loss_that_is_not_the_heads_is_refused(tmp_path):
    model = tiny_model(copy_attention="mean", unk_id=3, dropout=0.0)
    settings = _settings(tmp_path, cross_entropy="chunked")
    with pytest.raises(AttnkitError, match="needs a loss over the model's head alone"):
        Trainer(model, translation_batches(2), train=settings)
