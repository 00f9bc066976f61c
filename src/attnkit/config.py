"""Model configuration: one frozen dataclass that fully describes a Transformer (over 400 lines:
its 50 fields, each documented and checked, are one concept; split, a check lands apart from
the field it guards).

A model is built from a `ModelConfig` and nothing else, so a config saved as
JSON next to the weights is enough to rebuild it. Fields left as `None` are
resolved from the others when the config is made (for example `n_kv_heads`
defaults to `n_heads`), so what is saved is always explicit, and then every
field is checked (`attnkit.checks`). Named shapes are in `attnkit.presets`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnkit.checks import (
    check,
    choice,
    finite_fields,
    known,
    lookup,
    non_negative_int,
    positive,
    positive_int,
    within,
)
from attnkit.errors import AttnkitError
from attnkit.presets import PRESETS

SHAPES = ("encoder-decoder", "decoder", "encoder")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh")
NORMS = ("layernorm", "rmsnorm")
INITS = ("xavier", "gpt2")
NORM_POSITIONS = ("post", "pre", "deepnorm")
POSITIONALS = ("sinusoidal", "learned", "rope", "xpos", "alibi", "t5-relative", "none")
POSITIONAL_COMBINES = ("add", "concat")
ROPE_SCALINGS = ("ntk", "linear", "llama3")
SINUSOIDAL_LAYOUTS = ("interleaved", "split")
TIE_EMBEDDINGS = ("none", "decoder", "inputs", "all")
COPY_ATTENTIONS = ("none", "mean", "head")
ROUTERS = ("topk", "switch")
ATTENTION_KINDS = ("full", "linformer", "location-aware", "monotonic")
LINFORMER_SHARING = ("headwise", "key-value", "layerwise")
# Positions that bias or rotate scores, or neither: nothing to concatenate to the embeddings.
ABSOLUTE = ("sinusoidal", "learned")
# torch's fused attention kernels by name; `attnkit.nn.sdpa_backend` maps each to its kernel.
ATTENTION_BACKENDS = ("auto", "math", "flash", "efficient", "cudnn")
ROPE_SETTINGS = ("theta", "scaling", "scaling_type", "original_max_len")
# xPos's largest key factor is (1.4 / 0.4)^(max_len / B); 3.5^64 ~ 1e35 stays under float32's
# 3.4e38 (and bfloat16's), with room for the values it multiplies.
XPOS_MAX_SPAN = 64


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to build a model; names follow the paper.

    shape: `encoder-decoder` (the paper, translation), `decoder` (a language
        model, GPT) or `encoder` (a sentence encoder, BERT).
    vocab_size: the target vocabulary (the only one for single-stack shapes).
    src_vocab_size: the source vocabulary of an encoder-decoder; defaults to
        `vocab_size` (one joint vocabulary, as in the paper).
    d_model: the width of every vector between the sub-layers (the paper's d_model, 512).
    n_heads: attention heads per layer, each of d_model / n_heads dimensions (h, 8).
    n_encoder_layers, n_decoder_layers: blocks in each stack (N, 6); unset is 6 for the
        stacks the shape has and 0 for the other.
    d_ff: the inner width of each position-wise feed-forward network (d_ff, 2048).
    n_kv_heads: heads of keys and values; equal to `n_heads` is multi-head
        attention, fewer is grouped-query attention, 1 is multi-query.
    head_dim: the width of each head (d_k = d_v); unset is d_model / n_heads, the paper's
        split, and another value decouples the two (T5 v1.1 small: 6 heads of 64 in 512).
    dropout: on each sub-layer's output before the residual sum (P_drop).
    attention_dropout: on the attention weights.
    embedding_dropout: on the sum of embeddings and positional encodings.
    activation_dropout: on the feed-forward's hidden activations, before W_2 (fairseq's and
        Marian's `activation_dropout`).
    norm_position: `post` is the paper's LayerNorm(x + Sublayer(x)); `pre` is
        x + Sublayer(LayerNorm(x)), which trains deep stacks without warmup;
        `deepnorm` is LayerNorm(alpha x + Sublayer(x)) with down-scaled initial
        weights (Wang et al. 2022), post-LN that trains 1,000 layers deep.
    final_norm: a norm after the last block of each stack; defaults to on for
        pre-LN (whose residual stream is otherwise never normalised).
    scale_embeddings: multiply token embeddings by sqrt(d_model) (section 3.4).
    init: `xavier` (Glorot-uniform linear weights, as torch.nn.Transformer) or `gpt2`
        (every weight N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 layers))).
    tie_embeddings: `decoder` shares the target embedding with the output
        projection; `all` also shares it with the source embedding (one
        vocabulary for both sides, as in the paper); `inputs` shares one embedding
        between source and target but gives the output projection its own (T5 v1.1,
        Flan-T5).
    activation: `relu` (the paper), `gelu` (exact, BERT), `gelu_tanh` (GPT-2's
        approximation), `silu` (also called swish, Marian), or a gated unit,
        `swiglu` (LLaMA), `geglu` or `geglu_tanh` (T5 v1.1's gated-gelu, on GPT-2's tanh
        approximation), whose first projection has 2 d_ff outputs.
    norm: `layernorm` (the paper) or `rmsnorm` (no centring and no bias, LLaMA).
    norm_eps: the epsilon added to the variance inside each norm.
    positional: `sinusoidal` (the paper), `learned` (GPT-2, BERT), `rope`
        (rotary: queries and keys rotated by position, LLaMA), `xpos` (RoPE
        with a decay over distance, Sun et al. 2022), `alibi` (a linear
        penalty on distance added to attention scores), `t5-relative` (a learned
        bias per head and bucket of relative distance, Raffel et al. 2020,
        `nn/relative_bias.py`) or `none`.
    relative_buckets, relative_max_distance: T5's buckets of distance (half of them per
        direction in an encoder) and the distance from which all share the last one; half
        of a direction's buckets are exact distances, the rest log-spaced up to it.
    positional_combine: how absolute positions (sinusoidal, learned) meet the token
        embeddings: `add` (the paper) or `concat` ([E x; PE] projected back to d_model by a
        learned matrix, `nn/positional_combine.py`).
    positional_scale: the amplitude a of absolute positions (sinusoidal, learned) against the
        token embeddings: x = E[ids] sqrt(d_model) + a PE (1 is the paper).
    positional_interpolation: position interpolation s of sinusoidal positions: position p
        is read as p / s, so a model trained on L positions reads s L of them, each between
        two it trained on (1 reads positions as they are). Set as a run loads, with max_len.
    scale_scores: divide the attention scores by sqrt(d_head) (eq. 1); T5 does not,
        folding the factor into its initialisation instead.
    xpos_scale_base: xPos's B: pair i decays by zeta_i^(distance / B); at
        most 64 B positions (`max_len`). An encoder's stack (non-causal) rotates
        as plain RoPE: looking forward xPos's factor would grow with distance.
    rope_theta: RoPE's base; pair i turns at theta^(-2i/d_head) per position.
    rope_scaling, rope_scaling_type, rope_original_max_len: stretch of RoPE to
        rope_scaling x the trained length (1.0 is plain RoPE), in the way
        `rope_scaling_type` names: `ntk` (the base grows to theta * s^(d/(d-2))),
        `linear` (positions divided by s, Chen et al. 2023) or `llama3` (Llama 3.1's:
        slow pairs divided by s, fast ones kept, a blend between, set by
        `rope_original_max_len`).
    attention_window: each query attends only to keys fewer than this many
        positions away (a sliding window, Mistral; 0 is every position).
    attention_stride: sparse attention (Child et al. 2019, strided): besides
        its window a query also sees every key a multiple of this far away.
    attention_global, attention_random: an encoder's extra keys besides its
        window: the first `attention_global` positions attend to all and are
        attended by all (Longformer); each block of `attention_window` queries
        sees `attention_random` random key blocks, fixed per layer (BigBird).
    adapter_size: the bottleneck of Houlsby adapters after each sub-layer (0:
        none; `attnkit.nn.adapters`, usually set by a run's [adapters] section).
    attention_kind: `full` (the paper's); `linformer` (Wang et al. 2020: an encoder's
        keys and values projected along the sequence to `linformer_k` rows,
        `nn/linformer.py`); `location-aware` (Chorowski et al. 2015: the previous
        alignment, convolved, in the cross-attention's scores,
        `nn/location_attention.py`); `monotonic` (Raffel et al. 2017: cross-attention
        that moves left to right over the source, trained on its expected alignment and
        decoded hard, `nn/monotonic_attention.py`). Linformer changes the encoder's
        self-attention; the other two the decoder's cross-attention.
    linformer_k, linformer_sharing: Linformer's projected length k, and which layers share
        its projections E and F: `headwise` (each layer its own E and F, shared by its
        heads), `key-value` (each layer one E = F) or `layerwise` (one E = F for all
        layers).
    location_filters, location_kernel: location-aware attention's convolution of the
        previous alignment: filters per head and their width (odd).
    monotonic_chunk: 1 is hard monotonic attention (one source position a step); w > 1
        is MoChA (Chiu and Raffel 2018): soft attention over the w positions ending at the
        monotonic choice.
    monotonic_noise, monotonic_bias: the standard deviation of the noise added to the
        selection energies in training (which pushes their probabilities to 0 or 1), and
        the initial offset r of those energies (negative: start by moving on).
    attention_backend: torch's fused attention kernel: `auto` (torch picks),
        `flash`, `efficient`, `cudnn` or `math` (`nn/sdpa_backend.py`).
    n_experts, n_experts_per_token: a mixture of experts in place of each feed-forward
        network (0 is none): a router sends each token to `n_experts_per_token` of
        them and mixes their outputs by its renormalised softmax weights.
    router_aux_loss_coef: weight of the load-balancing loss (Switch
        Transformer) added to the training loss of a mixture of experts.
    router, capacity_factor: `topk` (Mixtral: the k weights renormalised) or `switch` (the Switch
        Transformer: one expert, weighted by its raw probability, at most
        `capacity_factor` x tokens / n_experts tokens an expert in training,
        the others dropped to the residual; 0 is no limit).
    max_len: the longest sequence the model reads, in tokens; positions past it are refused
        (learned positions have no row for them).
    bias: biases in the linear layers and norms (GPT-2 and the paper have them, LLaMA not).
    pad_id: the id of padding, which attention never attends to and the loss ignores.
    sinusoidal_layout: `interleaved` is the paper's sin/cos alternation over
        the dimensions; `split` puts every sin first and every cos second, as
        Marian does. The frequencies are the same.
    n_token_types: token-type (segment) embeddings added to the input, as
        BERT's sentence A / sentence B; 0 is none.
    embedding_norm: a norm on the sum of the input embeddings, before the
        first block (BERT).
    logits_bias: a learned bias added to the output logits (Marian's
        `final_logits_bias`).
    decoder_start_id: the id the decoder reads first when generating; None
        leaves it to the caller (Marian starts with its pad id).
    eos_id: the id that ends a generated sequence; None leaves it to the caller.
    copy_attention: a pointer-generator output (See et al. 2017, `nn/copy.py`)
        that mixes generating with copying source tokens through the last
        decoder layer's cross-attention, averaged over its heads (`mean`) or
        its first head (`head`); `none` is the plain output layer. Needs one
        vocabulary for both sides.
    unk_id: the id that words outside the vocabulary read as; what a
        pointer-generator's copied unknown words are embedded as.
    """

    shape: str = "encoder-decoder"
    vocab_size: int = 37000
    src_vocab_size: int | None = None
    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None
    head_dim: int | None = None
    n_encoder_layers: int | None = None
    n_decoder_layers: int | None = None
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    embedding_dropout: float = 0.1
    activation_dropout: float = 0.0
    activation: str = "relu"
    norm: str = "layernorm"
    norm_position: str = "post"
    norm_eps: float = 1e-5
    final_norm: bool | None = None
    positional: str = "sinusoidal"
    rope_theta: float = 10000.0
    rope_scaling: float = 1.0
    rope_scaling_type: str = "ntk"
    rope_original_max_len: int = 0
    xpos_scale_base: float = 512.0
    relative_buckets: int = 32
    relative_max_distance: int = 128
    positional_combine: str = "add"
    positional_scale: float = 1.0
    positional_interpolation: float = 1.0
    scale_scores: bool = True
    attention_window: int = 0
    attention_stride: int = 0
    attention_global: int = 0
    attention_random: int = 0
    adapter_size: int = 0
    attention_kind: str = "full"
    linformer_k: int = 256
    linformer_sharing: str = "headwise"
    location_filters: int = 32
    location_kernel: int = 31
    monotonic_chunk: int = 1
    monotonic_noise: float = 1.0
    monotonic_bias: float = -4.0
    attention_backend: str = "auto"
    n_experts: int = 0
    n_experts_per_token: int = 2
    router_aux_loss_coef: float = 0.01
    router: str = "topk"
    capacity_factor: float = 1.25
    max_len: int = 1024
    scale_embeddings: bool = True
    init: str = "xavier"
    tie_embeddings: str = "all"
    bias: bool = True
    pad_id: int = 0
    sinusoidal_layout: str = "interleaved"
    n_token_types: int = 0
    embedding_norm: bool = False
    logits_bias: bool = False
    decoder_start_id: int | None = None
    eos_id: int | None = None
    copy_attention: str = "none"
    unk_id: int | None = None

    def __post_init__(self) -> None:
        choice("shape", self.shape, SHAPES)
        if self.head_dim is None:
            # Checked before d_head is derived from it.
            positive_int("d_model", self.d_model)
            positive_int("n_heads", self.n_heads)
            check(
                self.d_model % self.n_heads == 0,
                f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}; set "
                "head_dim to give the heads a width of their own",
            )
        for name, value in self._derived().items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        self._validate()

    def _derived(self) -> dict[str, Any]:
        """What each field left as None becomes, given the others."""
        return {
            "n_kv_heads": self.n_heads,
            "head_dim": self.d_model // self.n_heads,
            "n_encoder_layers": 0 if self.shape == "decoder" else 6,
            "n_decoder_layers": 0 if self.shape == "encoder" else 6,
            "final_norm": self.norm_position == "pre",
            "src_vocab_size": self.vocab_size if self.shape == "encoder-decoder" else None,
        }

    def _validate(self) -> None:
        finite_fields(self)
        for name in ("vocab_size", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff"):
            positive_int(name, getattr(self, name))
        positive_int("max_len", self.max_len)
        check(
            self.n_kv_heads <= self.n_heads and self.n_heads % self.n_kv_heads == 0,
            f"n_kv_heads {self.n_kv_heads} must divide n_heads {self.n_heads} "
            "(equal is multi-head, fewer is grouped-query, 1 is multi-query attention)",
        )
        for name in ("dropout", "attention_dropout", "embedding_dropout", "activation_dropout"):
            within(name, getattr(self, name), "[0, 1)")
        choice("activation", self.activation, ACTIVATIONS)
        choice("norm", self.norm, NORMS)
        choice("init", self.init, INITS)
        choice("norm_position", self.norm_position, NORM_POSITIONS)
        choice("positional", self.positional, POSITIONALS)
        choice("rope_scaling_type", self.rope_scaling_type, ROPE_SCALINGS)
        choice("tie_embeddings", self.tie_embeddings, TIE_EMBEDDINGS)
        choice("positional_combine", self.positional_combine, POSITIONAL_COMBINES)
        positive("norm_eps", self.norm_eps)
        choice("sinusoidal_layout", self.sinusoidal_layout, SINUSOIDAL_LAYOUTS)
        self._validate_variants()
        self._validate_shape()
        self._validate_copy()
        check(
            0 <= self.pad_id < max(self.vocab_size, self.src_vocab_size or 0),
            f"pad_id {self.pad_id} is outside the vocabulary of {self.vocab_size} tokens",
        )
        self._validate_interop_fields()

    def _validate_variants(self) -> None:
        """The later variants' settings: each in range, and only where it applies (the window
        and its strided, global and random keys; RoPE and xPos; T5's relative buckets and
        concatenated positions; the kinds of attention; the mixture of experts and its router;
        the fused attention kernel)."""
        extra = ("attention_global", "attention_random", "adapter_size")
        for name in ("attention_window", "attention_stride", "n_experts", *extra):
            non_negative_int(name, getattr(self, name))
        check(
            not (self.attention_global or self.attention_random)
            or (
                self.attention_window
                and self.shape != "decoder"
                and self.positional not in ("alibi", "t5-relative")
            ),
            "attention_global and attention_random add keys to an encoder's window: set "
            "attention_window, use a shape with an encoder, and a positional other than alibi "
            "or t5-relative",
        )
        check(
            not self.attention_stride or self.attention_window,
            "attention_stride adds strided keys to a local window; set attention_window too "
            "(Child et al. use a window equal to the stride)",
        )
        rope = [getattr(self, f"rope_{n}") for n in ROPE_SETTINGS]
        check(
            self.positional in ("rope", "xpos") or rope == [10000.0, 1.0, "ntk", 0],
            f"the rope_ settings only apply to RoPE and xPos, but positional is "
            f"{self.positional!r}; set positional to 'rope' or leave them at their defaults",
        )
        check(
            0 < self.max_len / self.xpos_scale_base <= XPOS_MAX_SPAN,
            f"xPos scales keys by up to 3.5^(position / xpos_scale_base), which float32 holds "
            f"to {XPOS_MAX_SPAN} scale bases; max_len {self.max_len} needs xpos_scale_base of "
            f"at least {self.max_len / XPOS_MAX_SPAN:g}",
        )
        if self.positional in ("rope", "xpos"):
            check(
                self.d_head % 2 == 0,
                f"RoPE turns pairs of dimensions; d_head {self.d_head} is odd",
            )
            check(
                self.rope_theta > 1.0 and self.rope_scaling >= 1.0,
                f"rope_theta must be over 1 and rope_scaling at least 1, got "
                f"{self.rope_theta!r} and {self.rope_scaling!r}",
            )
            check(
                (self.rope_scaling_type == "llama3") == (self.rope_original_max_len > 0),
                "rope_original_max_len (the trained length, 8192 for Llama 3.1) is what "
                "llama3 scaling needs, and only it; set both or neither, got "
                f"rope_scaling_type {self.rope_scaling_type!r} and rope_original_max_len "
                f"{self.rope_original_max_len!r}",
            )
        self._validate_relative()
        self._validate_attention_kind()
        check(
            not self.n_experts or 1 <= self.n_experts_per_token <= self.n_experts,
            f"n_experts_per_token must be between 1 and n_experts {self.n_experts}, "
            f"got {self.n_experts_per_token!r}",
        )
        choice("router", self.router, ROUTERS)
        choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        check(
            self.router != "switch" or self.n_experts_per_token == 1,
            "the switch router sends each token to one expert; set n_experts_per_token = 1",
        )
        check(
            self.capacity_factor >= 0,
            f"capacity_factor must be 0 (no limit) or more, got {self.capacity_factor!r}",
        )
        check(
            self.router_aux_loss_coef >= 0,
            f"router_aux_loss_coef must be non-negative, got {self.router_aux_loss_coef!r}",
        )

    def _validate_relative(self) -> None:
        """T5's buckets, and concatenation of absolute positions only."""
        for name in ("relative_buckets", "relative_max_distance"):
            non_negative_int(name, getattr(self, name))
        if self.positional == "t5-relative":
            check(
                self.relative_buckets >= 4 and self.relative_buckets % 2 == 0,
                f"relative_buckets must be even and at least 4 (half a direction's buckets are "
                f"exact distances, half log-spaced), got {self.relative_buckets}",
            )
            check(
                self.relative_max_distance > self.relative_buckets // 2,
                f"relative_max_distance {self.relative_max_distance} must exceed the exact "
                f"distances of a direction, relative_buckets / 2 = {self.relative_buckets // 2} "
                "in a decoder",
            )
        check(
            self.positional_scale > 0
            and (self.positional_scale == 1.0 or self.positional in ABSOLUTE),
            f"positional_scale is the amplitude of absolute position vectors, over 0 and only "
            f"with positional one of {', '.join(ABSOLUTE)} (positional 'none' drops them); got "
            f"{self.positional_scale!r} with positional {self.positional!r}",
        )
        check(
            self.positional_interpolation > 0
            and (self.positional_interpolation == 1.0 or self.positional == "sinusoidal"),
            f"positional_interpolation reads sinusoidal position p as p / s, over 0 and only "
            f"with positional 'sinusoidal' (a learned table has no rows between its positions; "
            f"RoPE has rope_scaling); got {self.positional_interpolation!r} with positional "
            f"{self.positional!r}",
        )
        check(
            self.positional_combine == "add" or self.positional in ABSOLUTE,
            f"positional_combine 'concat' joins absolute position vectors to the embeddings; "
            f"positional {self.positional!r} has none, so leave it 'add' or use one of "
            f"{', '.join(ABSOLUTE)}",
        )

    def _validate_attention_kind(self) -> None:
        """Linformer on an encoder's unwindowed attention; location-aware and monotonic attention
        on a decoder's cross-attention."""
        choice("attention_kind", self.attention_kind, ATTENTION_KINDS)
        choice("linformer_sharing", self.linformer_sharing, LINFORMER_SHARING)
        for name in ("linformer_k", "location_filters", "location_kernel", "monotonic_chunk"):
            non_negative_int(name, getattr(self, name))
        kind = self.attention_kind
        if kind == "linformer":
            check(
                self.shape != "decoder",
                "attention_kind 'linformer' mixes keys along the whole sequence, so a causal "
                "decoder's query would see the future; use it with an encoder or encoder-decoder "
                "model (whose decoder keeps full attention)",
            )
            check(
                1 <= self.linformer_k <= self.max_len,
                f"linformer_k is the projected length, between 1 and max_len {self.max_len}, got "
                f"{self.linformer_k}",
            )
            check(
                self.positional in (*ABSOLUTE, "none") and not self.attention_window,
                "attention_kind 'linformer' projects keys along the sequence, which leaves no "
                "distance between a query and a key for rope, xpos, alibi, t5-relative or an "
                "attention_window; use sinusoidal or learned positions and no window",
            )
        if kind in ("location-aware", "monotonic"):
            check(
                self.shape == "encoder-decoder",
                f"attention_kind {kind!r} changes cross-attention, which only an encoder-decoder "
                f"model has, not a {self.shape} one",
            )
            check(
                self.copy_attention == "none",
                f"attention_kind {kind!r} and copy_attention both read the cross-attention of the "
                "last layer; use one of them",
            )
        check(
            self.location_kernel % 2 == 1 and self.location_filters >= 1,
            f"location_kernel must be odd (centred on each source position) and location_filters "
            f"at least 1, got {self.location_kernel} and {self.location_filters}",
        )
        check(
            self.monotonic_chunk >= 1,
            f"monotonic_chunk must be at least 1, got {self.monotonic_chunk}",
        )
        check(
            self.monotonic_noise >= 0,
            f"monotonic_noise is a standard deviation, 0 or more, got {self.monotonic_noise!r}",
        )

    def _validate_interop_fields(self) -> None:
        non_negative_int("n_token_types", self.n_token_types, zero="none")
        check(
            self.sinusoidal_layout == "interleaved" or self.positional == "sinusoidal",
            f"sinusoidal_layout {self.sinusoidal_layout!r} only applies to sinusoidal "
            f"positions, but positional is {self.positional!r}; leave it 'interleaved'",
        )
        check(
            self.decoder_start_id is None or self.shape != "encoder",
            "decoder_start_id is for models that generate; an encoder model has no "
            "decoder, so leave it None",
        )
        for name in ("decoder_start_id", "eos_id", "unk_id"):
            value = getattr(self, name)
            is_id = isinstance(value, int) and not isinstance(value, bool)
            check(
                value is None or (is_id and 0 <= value < self.vocab_size),
                f"{name} {value} is outside the target vocabulary of {self.vocab_size} "
                "tokens; use an id of the tokenizer or None",
            )

    def _validate_copy(self) -> None:
        choice("copy_attention", self.copy_attention, COPY_ATTENTIONS)
        if self.copy_attention == "none":
            return
        check(
            self.shape == "encoder-decoder",
            f"copy_attention copies source tokens into the output; a {self.shape} model has "
            "no source, so leave it 'none'",
        )
        check(
            self.src_vocab_size == self.vocab_size,
            f"copy_attention copies source ids as target ids, so both sides need one "
            f"vocabulary, but src_vocab_size is {self.src_vocab_size} and vocab_size is "
            f"{self.vocab_size}",
        )

    def _validate_shape(self) -> None:
        needs = {
            "encoder-decoder": ("n_encoder_layers", "n_decoder_layers"),
            "decoder": ("n_decoder_layers",),
            "encoder": ("n_encoder_layers",),
        }[self.shape]
        for name in needs:
            check(getattr(self, name) >= 1, f"a {self.shape} model needs {name} >= 1")
        for name in {"n_encoder_layers", "n_decoder_layers"} - set(needs):
            check(
                getattr(self, name) == 0,
                f"a {self.shape} model has no {name[2:-7]}: set {name} to 0",
            )
        if self.src_vocab_size is not None:
            check(
                self.shape == "encoder-decoder",
                f"src_vocab_size is only for encoder-decoder models; a {self.shape} model "
                "has one vocabulary, vocab_size",
            )
            positive_int("src_vocab_size", self.src_vocab_size)
        if self.tie_embeddings in ("all", "inputs"):
            tie = self.tie_embeddings
            check(
                self.shape == "encoder-decoder",
                f"tie_embeddings {tie!r} needs a source and a target side; a {self.shape} "
                "model ties its input and output with 'decoder'",
            )
            check(
                self.src_vocab_size == self.vocab_size,
                f"tie_embeddings {tie!r} needs one shared vocabulary, but src_vocab_size is "
                f"{self.src_vocab_size} and vocab_size is {self.vocab_size}",
            )

    @property
    def d_head(self) -> int:
        """d_k = d_v = d_model / h (section 3.2.2), or `head_dim` where it is set apart."""
        return self.head_dim

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed, validated again."""
        _check_fields(changes)
        # A field still at the value derived from the others is derived again
        # (n_heads=4 -> 2 keeps multi-head attention rather than breaking n_kv_heads).
        rederive = {
            name: None
            for name, value in self._derived().items()
            if name not in changes and getattr(self, name) == value
        }
        return dataclasses.replace(self, **rederive, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        _check_fields(data)
        return cls(**data)

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, source: str | Path) -> ModelConfig:
        """Read a config from a JSON string or from a file path."""
        text = str(source)
        if not text.lstrip().startswith("{"):
            path = Path(source)
            if not path.is_file():
                raise AttnkitError(f"no config file at {path}")
            text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is no JSON
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise AttnkitError(f"the config is not valid JSON: {err}") from None
        return cls.from_dict(data)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A named preset (see `attnkit.presets`), with some fields overridden."""
        return cls.from_dict({**lookup("preset", name, PRESETS), **overrides})


def _check_fields(names: Iterable[str]) -> None:
    """Every name must be a field of `ModelConfig`; the first that is not gets the nearest."""
    known("field", names, [f.name for f in dataclasses.fields(ModelConfig)], owner="ModelConfig")
