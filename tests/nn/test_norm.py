"""RMSNorm against its formula and LLaMA's; DeepNorm against the DeepNet paper."""

import math

import pytest
import torch

from attnkit import ModelConfig, build_model
from attnkit.nn import Residual, make_norm
from attnkit.nn.norm import deepnorm_constants


def test_rmsnorm_is_its_formula_and_llamas() -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    x = torch.randn(3, 5, 16) * 3 + 1
    ours = make_norm("rmsnorm", 16, 1e-6)
    theirs = LlamaRMSNorm(16, eps=1e-6)
    with torch.no_grad():
        ours.weight.normal_()
        theirs.weight.copy_(ours.weight)
    formula = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * ours.weight
    torch.testing.assert_close(ours(x), formula)
    torch.testing.assert_close(ours(x), theirs(x))
    assert [name for name, _ in ours.named_parameters()] == ["weight"]  # no bias, no centring


@pytest.mark.parametrize(
    ("n_encoder", "n_decoder", "encoder", "decoder"),
    [
        # Values worked out by hand from the paper's table 1.
        (6, 6, (1.4179, 0.4970), (2.0598, 0.3433)),  # 0.81 (N^4 M)^(1/16); (3M)^(1/4)
        (12, 0, (2.2134, 0.3195), (2.2134, 0.3195)),  # encoder only: (2N)^(1/4), (8N)^(-1/4)
        (0, 100, (3.7606, 0.1880), (3.7606, 0.1880)),  # decoder only: (2M)^(1/4), (8M)^(-1/4)
    ],
)
def test_deepnorm_constants_are_the_papers(n_encoder, n_decoder, encoder, decoder) -> None:
    constants = deepnorm_constants(n_encoder, n_decoder)
    for side, expected in (("encoder", encoder), ("decoder", decoder)):
        for got, want in zip(constants[side], expected, strict=True):
            assert math.isclose(got, want, abs_tol=1e-4), (side, got, want)


def test_deepnorm_residual_weighs_the_input_by_alpha() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    residual = Residual(make_norm("layernorm", 8, 1e-5), "deepnorm", 0.0, alpha=2.5)
    assert torch.equal(residual.before(x), x)
    torch.testing.assert_close(
        residual.after(x, y), torch.nn.functional.layer_norm(2.5 * x + y, (8,))
    )


def test_deepnorm_scales_values_outputs_and_ffn_by_beta_and_nothing_else() -> None:
    sizes = {"vocab_size": 40, "d_model": 32, "n_heads": 4, "d_ff": 64, "n_encoder_layers": 3}
    configs = [ModelConfig(**sizes, norm_position=p) for p in ("post", "deepnorm")]
    models = []
    for config in configs:
        torch.manual_seed(0)
        models.append(build_model(config))
    post, deep = (dict(m.named_parameters()) for m in models)
    betas = {side: beta for side, (_, beta) in deepnorm_constants(3, 6).items()}
    assert not configs[1].final_norm  # post-LN: the last block's norm closes the stream
    for name, weight in deep.items():
        side = "encoder" if name.startswith("encoder.") else "decoder"
        scale = 1.0
        if (".ff." in name and name.endswith("weight")) or name.endswith("out_proj.weight"):
            scale = betas[side]
        elif name.endswith(("qkv_proj.weight", "kv_proj.weight")):
            v_rows = weight.shape[0] // (3 if "qkv" in name else 2)
            torch.testing.assert_close(weight[:-v_rows], post[name][:-v_rows])
            torch.testing.assert_close(weight[-v_rows:], post[name][-v_rows:] * betas[side])
            continue
        torch.testing.assert_close(weight, post[name] * scale, msg=name)
