"""The checks of the later variants' settings: each in range, and only where it applies.

The window and its strided, global and random keys; RoPE's and xPos's settings;
T5's relative buckets and concatenated positions; the kinds of attention (Linformer,
location-aware, monotonic); the mixture of experts and its router; the fused
attention kernel. Called by
`ModelConfig` when a config is made (`check_variants`), so a config that cannot
build a working model is refused in one sentence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnkit.checks import check, choice, non_negative_int
from attnkit.nn.sdpa_backend import BACKENDS

if TYPE_CHECKING:
    from attnkit.config import ModelConfig

ROUTERS = ("topk", "switch")
ATTENTION_KINDS = ("full", "linformer", "location-aware", "monotonic")
LINFORMER_SHARING = ("headwise", "key-value", "layerwise")
# Positions that bias or rotate scores, or neither: nothing to concatenate to the embeddings.
ABSOLUTE = ("sinusoidal", "learned")
ROPE_SETTINGS = ("theta", "scaling", "scaling_type", "original_max_len")
# xPos's largest key factor is (1.4 / 0.4)^(max_len / B); 3.5^64 ~ 1e35 stays under float32's
# 3.4e38 (and bfloat16's), with room for the values it multiplies.
XPOS_MAX_SPAN = 64


def check_variants(c: ModelConfig) -> None:
    """Refuse, in one sentence, a variant setting out of range or where it cannot apply."""
    extra = ("attention_global", "attention_random", "adapter_size")
    for name in ("attention_window", "attention_stride", "n_experts", *extra):
        non_negative_int(name, getattr(c, name))
    check(
        not (c.attention_global or c.attention_random)
        or (
            c.attention_window
            and c.shape != "decoder"
            and c.positional not in ("alibi", "t5-relative")
        ),
        "attention_global and attention_random add keys to an encoder's window: set "
        "attention_window, use a shape with an encoder, and a positional other than alibi "
        "or t5-relative",
    )
    check(
        not c.attention_stride or c.attention_window,
        "attention_stride adds strided keys to a local window; set attention_window too "
        "(Child et al. use a window equal to the stride)",
    )
    rope = [getattr(c, f"rope_{n}") for n in ROPE_SETTINGS]
    check(
        c.positional in ("rope", "xpos") or rope == [10000.0, 1.0, "ntk", 0],
        f"the rope_ settings only apply to RoPE and xPos, but positional is "
        f"{c.positional!r}; set positional to 'rope' or leave them at their defaults",
    )
    check(
        0 < c.max_len / c.xpos_scale_base <= XPOS_MAX_SPAN,
        f"xPos scales keys by up to 3.5^(position / xpos_scale_base), which float32 holds "
        f"to {XPOS_MAX_SPAN} scale bases; max_len {c.max_len} needs xpos_scale_base of "
        f"at least {c.max_len / XPOS_MAX_SPAN:g}",
    )
    if c.positional in ("rope", "xpos"):
        check(
            c.d_head % 2 == 0,
            f"RoPE turns pairs of dimensions; d_head {c.d_head} is odd",
        )
        check(
            c.rope_theta > 1.0 and c.rope_scaling >= 1.0,
            f"rope_theta must be over 1 and rope_scaling at least 1, got "
            f"{c.rope_theta!r} and {c.rope_scaling!r}",
        )
        check(
            (c.rope_scaling_type == "llama3") == (c.rope_original_max_len > 0),
            "rope_original_max_len (the trained length, 8192 for Llama 3.1) is what "
            "llama3 scaling needs, and only it; set both or neither, got "
            f"rope_scaling_type {c.rope_scaling_type!r} and rope_original_max_len "
            f"{c.rope_original_max_len!r}",
        )
    _check_relative(c)
    check_attention_kind(c)
    check(
        not c.n_experts or 1 <= c.n_experts_per_token <= c.n_experts,
        f"n_experts_per_token must be between 1 and n_experts {c.n_experts}, "
        f"got {c.n_experts_per_token!r}",
    )
    choice("router", c.router, ROUTERS)
    choice("attention_backend", c.attention_backend, tuple(BACKENDS))
    check(
        c.router != "switch" or c.n_experts_per_token == 1,
        "the switch router sends each token to one expert; set n_experts_per_token = 1",
    )
    check(
        c.capacity_factor >= 0,
        f"capacity_factor must be 0 (no limit) or more, got {c.capacity_factor!r}",
    )
    check(
        c.router_aux_loss_coef >= 0,
        f"router_aux_loss_coef must be non-negative, got {c.router_aux_loss_coef!r}",
    )


def _check_relative(c: ModelConfig) -> None:
    """T5's buckets, and concatenation of absolute positions only."""
    for name in ("relative_buckets", "relative_max_distance"):
        non_negative_int(name, getattr(c, name))
    if c.positional == "t5-relative":
        check(
            c.relative_buckets >= 4 and c.relative_buckets % 2 == 0,
            f"relative_buckets must be even and at least 4 (half a direction's buckets are "
            f"exact distances, half log-spaced), got {c.relative_buckets}",
        )
        check(
            c.relative_max_distance > c.relative_buckets // 2,
            f"relative_max_distance {c.relative_max_distance} must exceed the exact distances "
            f"of a direction, relative_buckets / 2 = {c.relative_buckets // 2} in a decoder",
        )
    check(
        c.positional_combine == "add" or c.positional in ABSOLUTE,
        f"positional_combine 'concat' joins absolute position vectors to the embeddings; "
        f"positional {c.positional!r} has none, so leave it 'add' or use one of "
        f"{', '.join(ABSOLUTE)}",
    )


def check_attention_kind(c: ModelConfig) -> None:
    """Linformer on an encoder's unwindowed attention; location-aware and monotonic attention
    on a decoder's cross-attention."""
    choice("attention_kind", c.attention_kind, ATTENTION_KINDS)
    choice("linformer_sharing", c.linformer_sharing, LINFORMER_SHARING)
    for name in ("linformer_k", "location_filters", "location_kernel", "monotonic_chunk"):
        non_negative_int(name, getattr(c, name))
    kind = c.attention_kind
    if kind == "linformer":
        check(
            c.shape != "decoder",
            "attention_kind 'linformer' mixes keys along the whole sequence, so a causal "
            "decoder's query would see the future; use it with an encoder or encoder-decoder "
            "model (whose decoder keeps full attention)",
        )
        check(
            1 <= c.linformer_k <= c.max_len,
            f"linformer_k is the projected length, between 1 and max_len {c.max_len}, got "
            f"{c.linformer_k}",
        )
        check(
            c.positional in (*ABSOLUTE, "none") and not c.attention_window,
            "attention_kind 'linformer' projects keys along the sequence, which leaves no "
            "distance between a query and a key for rope, xpos, alibi, t5-relative or an "
            "attention_window; use sinusoidal or learned positions and no window",
        )
    if kind in ("location-aware", "monotonic"):
        check(
            c.shape == "encoder-decoder",
            f"attention_kind {kind!r} changes cross-attention, which only an encoder-decoder "
            f"model has, not a {c.shape} one",
        )
        check(
            c.copy_attention == "none",
            f"attention_kind {kind!r} and copy_attention both read the cross-attention of the "
            "last layer; use one of them",
        )
    check(
        c.location_kernel % 2 == 1 and c.location_filters >= 1,
        f"location_kernel must be odd (centred on each source position) and location_filters "
        f"at least 1, got {c.location_kernel} and {c.location_filters}",
    )
    check(c.monotonic_chunk >= 1, f"monotonic_chunk must be at least 1, got {c.monotonic_chunk}")
    check(
        c.monotonic_noise >= 0,
        f"monotonic_noise is a standard deviation, 0 or more, got {c.monotonic_noise!r}",
    )
