"""Positional encodings against their papers' formulas and against transformers."""

import math

import pytest
import torch

from attnkit.nn import AbsolutePositions, sinusoidal_table
from attnkit.nn.masks import slot_distance
from attnkit.nn.positional import (
    RotaryEmbedding,
    XPos,
    alibi_bias,
    alibi_slopes,
    rope_frequencies,
)


def test_sinusoidal_table_is_the_papers_formula() -> None:
    max_len, d = 50, 16
    table = sinusoidal_table(max_len, d)
    for pos in range(max_len):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert math.isclose(table[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(table[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)


def test_sinusoidal_positions_are_fixed_and_not_saved() -> None:
    positions = AbsolutePositions(32, 8, learned=False)
    assert list(positions.parameters()) == []
    assert positions.state_dict() == {}


def test_explicit_positions_index_the_table() -> None:
    positions = AbsolutePositions(32, 8, learned=True)
    x = torch.zeros(2, 3, 8)
    shifted = positions(x, torch.tensor([[0, 1, 2], [5, 6, 7]]))
    torch.testing.assert_close(shifted[0], positions.table[:3])
    torch.testing.assert_close(shifted[1], positions.table[5:8])
    torch.testing.assert_close(positions(x), positions.table[:3].expand(2, 3, 8))


def test_rope_equals_transformers_llama_rotation() -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    d, theta = 16, 500.0
    rope = RotaryEmbedding(d, 64, theta)
    q, k = torch.randn(2, 4, 9, d), torch.randn(2, 2, 9, d)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 1, 2, 3, 4, 5, 6]])
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions[..., None].double() * inv_freq
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos.float(), sin.float())
    q_ours, k_ours = rope(q, k, positions, positions)
    torch.testing.assert_close(q_ours, q_ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(k_ours, k_ref, atol=1e-6, rtol=0)


def test_rope_scores_depend_only_on_the_distance() -> None:
    rope = RotaryEmbedding(8, 200)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m: int, n: int) -> float:
        rq, rk = rope(q, k, torch.tensor([[m]]), torch.tensor([[n]]))
        return (rq * rk).sum().item()

    assert math.isclose(score(3, 10), score(103, 110), abs_tol=1e-5)
    assert not math.isclose(score(3, 10), score(3, 11), abs_tol=1e-3)
    # A rotation: lengths are kept.
    rq, _ = rope(q, k, torch.tensor([[57]]), torch.tensor([[0]]))
    torch.testing.assert_close(rq.norm(), q.norm())


def test_ntk_scaling_is_transformers_dynamic_ntk_at_the_stretched_length() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d, trained, s = 16, 32, 4.0
    hf = LlamaConfig(
        hidden_size=4 * d,
        num_attention_heads=4,
        max_position_embeddings=trained,
        rope_parameters={"rope_type": "dynamic", "factor": 1.0, "rope_theta": 10000.0},
    )
    inv_freq, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf, seq_len=int(s * trained))
    rope = RotaryEmbedding(d, int(s * trained), 10000.0, scaling=s)
    angles = torch.arange(int(s * trained), dtype=torch.float64)[:, None] * inv_freq.double()
    torch.testing.assert_close(rope.cos, angles.cos().float(), atol=2e-5, rtol=0)
    torch.testing.assert_close(rope.sin, angles.sin().float(), atol=2e-5, rtol=0)
    # The fastest pair is unchanged, the slowest turns s times slower.
    plain = RotaryEmbedding(d, 8)
    torch.testing.assert_close(rope.cos[1, 0], plain.cos[1, 0])
    slowest = lambda r: torch.atan2(r.sin[1, -1], r.cos[1, -1]).item()  # noqa: E731
    assert math.isclose(slowest(plain) / slowest(rope), s, rel_tol=1e-4)


def test_alibi_slopes_equal_bloom_for_any_number_of_heads() -> None:
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    for n_heads in (1, 4, 6, 8, 12, 16):
        # Bloom's bias at key position 1 is one slope per head.
        bloom = build_alibi_tensor(torch.ones(1, 2), n_heads, torch.float32)[:, 0, 1]
        torch.testing.assert_close(alibi_slopes(n_heads), bloom)
    assert alibi_slopes(8).tolist() == [2.0**-i for i in range(1, 9)]


def test_alibi_bias_is_minus_slope_times_distance() -> None:
    slopes = alibi_slopes(4)
    bias = alibi_bias(slopes, slot_distance(2, 5))
    assert bias.shape == (1, 4, 2, 5)
    for h in range(4):
        for i, query in enumerate((3, 4)):  # the queries are the last two keys
            for key in range(5):
                expected = -slopes[h].item() * abs(query - key)
                assert math.isclose(bias[0, h, i, key].item(), expected, abs_tol=1e-7)


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        ("linear", {}),
        # A trained length of 512 puts the 64 dimensions' pairs in all three of Llama 3.1's
        # bands: kept (wavelength under 128), blended, divided (over 512).
        ("llama3", {"low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    ],
)
def test_linear_and_llama3_scaling_are_transformers(kind: str, extra: dict) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d, theta, s, trained = 64, 500000.0, 8.0, 512
    params = {"rope_type": kind, "factor": s, "rope_theta": theta, **extra}
    if kind == "llama3":
        params["original_max_position_embeddings"] = trained
    hf = LlamaConfig(hidden_size=4 * d, num_attention_heads=4, rope_parameters=params)
    expected, _ = ROPE_INIT_FUNCTIONS[kind](hf, device=None)
    ours = rope_frequencies(d, theta, s, kind, trained if kind == "llama3" else 0)
    torch.testing.assert_close(ours.float(), expected.float(), rtol=1e-6, atol=0)
    plain = rope_frequencies(d, theta)
    ratio = plain / ours
    if kind == "linear":
        torch.testing.assert_close(ratio, torch.full_like(ratio, s))
    else:
        wavelength = 2 * math.pi / plain
        assert (
            ratio[wavelength < trained / 4].eq(1).all() and ratio[wavelength > trained].eq(s).all()
        )
        blended = ratio[(wavelength >= trained / 4) & (wavelength <= trained)]
        assert len(blended) > 0 and ((blended > 1) & (blended < s)).all()


def test_xpos_is_rope_scaled_by_zeta_to_the_position_over_the_base() -> None:
    d, base = 8, 16.0
    xpos, rope = XPos(d, 40, scale_base=base), RotaryEmbedding(d, 40)
    q, k = torch.randn(1, 1, 3, d), torch.randn(1, 1, 3, d)
    pos = torch.tensor([[0, 7, 33]])
    got_q, got_k = xpos(q, k, pos, pos)
    rot_q, rot_k = rope(q, k, pos, pos)
    # The formula in float64: zeta_i = (2i/d + 0.4) / 1.4, for pair (i, i + d/2).
    zeta = (torch.arange(0, d, 2, dtype=torch.float64) / d + 0.4) / 1.4
    power = zeta ** (pos[0, :, None].double() / base)  # (length, d/2)
    both = torch.cat([power, power], -1)
    torch.testing.assert_close(got_q.double(), rot_q.double() * both, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_k.double(), rot_k.double() / both, rtol=1e-5, atol=1e-6)


def test_xpos_scores_depend_only_on_the_distance_and_fade_with_it() -> None:
    xpos = XPos(16, 200, scale_base=8.0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m: int, n: int) -> float:
        a, b = xpos(q, k, torch.tensor([[m]]), torch.tensor([[n]]))
        return (a * b).sum().item()

    assert score(9, 2) == pytest.approx(score(150, 143), rel=1e-4)
    # At distance t pair i weighs at most zeta_i^(t / B) |q_i| |k_i|: at 100 (over 12 B) even
    # the slowest pair (zeta 0.91) keeps under a third, the fastest (0.29) nothing.
    zeta = (torch.arange(0, 16, 2, dtype=torch.float64) / 16 + 0.4) / 1.4
    pairs = [t.view(2, 8).norm(dim=0).double() for t in (q, k)]  # |(x_i, x_{i+8})|
    bound = (zeta ** (100 / 8.0) * pairs[0] * pairs[1]).sum().item()
    assert abs(score(100, 0)) <= bound + 1e-6
    assert bound < 0.35 * (q.norm() * k.norm()).item()


def test_xpos_decays_in_causal_stacks_only_and_bounds_its_span() -> None:
    from attnkit.errors import AttnkitError
    from tests.helpers import tiny_config, tiny_model

    model = tiny_model("encoder-decoder", positional="xpos")
    rotary = {name: block.self_attn.rotary for name, block in model.named_modules()
              if hasattr(block, "self_attn")}  # fmt: skip
    kinds = {type(r) for n, r in rotary.items() if n.startswith("encoder")}
    assert kinds == {RotaryEmbedding}  # looking forward, xPos's factor would grow
    assert {type(r) for n, r in rotary.items() if n.startswith("decoder")} == {XPos}
    with pytest.raises(AttnkitError, match="xpos_scale_base of at least 16"):
        tiny_config("decoder", positional="xpos", max_len=1024, xpos_scale_base=8.0)


def _rotation(k: int, d: int, layout: str) -> torch.Tensor:
    """M_k: for each frequency w_i, the 2 x 2 rotation by k w_i that takes (sin p w_i,
    cos p w_i) to (sin (p + k) w_i, cos (p + k) w_i), placed on that pair's two dimensions."""
    w = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * (-math.log(10000.0) / d))
    sin_dims = range(0, d, 2) if layout == "interleaved" else range(d // 2)
    cos_dims = range(1, d, 2) if layout == "interleaved" else range(d // 2, d)
    m = torch.zeros(d, d, dtype=torch.float64)
    for i, (s, c) in enumerate(zip(sin_dims, cos_dims, strict=True)):
        # sin(a + b) = sin a cos b + cos a sin b;  cos(a + b) = cos a cos b - sin a sin b
        m[s, s], m[s, c] = math.cos(k * w[i]), math.sin(k * w[i])
        m[c, s], m[c, c] = -math.sin(k * w[i]), math.cos(k * w[i])
    return m


@pytest.mark.parametrize("layout", ["interleaved", "split"])
@pytest.mark.parametrize("k", [1, 7, 40])
def test_a_shift_by_k_is_one_rotation_per_frequency_pair_whatever_the_position(layout, k) -> None:
    # PE(p + k) = M_k PE(p), M_k depending on k alone: a linear function of PE(p) reaches
    # PE(p + k), which is why the paper expected relative positions to be easy to attend by.
    d, length = 32, 200
    table = sinusoidal_table(length + k, d, layout).double()
    m = _rotation(k, d, layout)
    torch.testing.assert_close(table[k:], table[:length] @ m.T, atol=2e-6, rtol=0)
    # a rotation keeps lengths: every PE(p) has length sqrt(d / 2)
    torch.testing.assert_close(m @ m.T, torch.eye(d, dtype=torch.float64))
    norms = table.norm(dim=1)
    torch.testing.assert_close(norms, torch.full_like(norms, math.sqrt(d / 2)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", ["interleaved", "split"])
def test_the_dot_product_of_two_positions_depends_on_their_distance_alone(layout) -> None:
    d, length, offsets = 64, 300, torch.arange(100)
    table = sinusoidal_table(length, d, layout).double()
    w = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * (-math.log(10000.0) / d))
    expected = torch.cos(offsets[:, None] * w).sum(1)  # sum_i cos(k w_i)
    for p in (0, 1, 50, 199):
        dots = table[p + offsets] @ table[p]
        torch.testing.assert_close(dots, expected, atol=1e-5, rtol=0)
    # and it is symmetric: PE(p) . PE(p + k) = PE(p) . PE(p - k)
    p = 150
    torch.testing.assert_close(table[p + offsets] @ table[p], table[p - offsets] @ table[p])
