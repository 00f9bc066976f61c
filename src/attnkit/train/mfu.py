"""Model FLOPs utilisation (MFU): the share of the device's peak that training turns into the
model's own arithmetic (Chowdhery et al. 2022, PaLM, appendix B).

A training step costs, per token of a sequence of T tokens,

    6 N + 12 L d_model T   FLOPs

6 N for the forward (2 N: a multiply and an add per weight) and backward (4 N) products of
the N weights every token passes through, and 12 L d_model T for attention's two products
(Q K^T and A V, forward and backward) over T keys in each of L layers, counted whole as
PaLM and nanoGPT's `estimate_mfu` count them (a causal mask needs about half). N leaves out
the token and position tables, which a token looks up rather than multiplies; a head tied
to the token table multiplies, so it counts once. Recomputing activations
(`train.activation_checkpointing`) adds work this does not count: MFU, not the hardware's
utilisation.

    MFU = tokens/s x FLOPs a token / (peak FLOP/s a device x devices)

The peak is the dense bfloat16 tensor-core figure of the GPU's data sheet, looked up by
`torch.cuda.get_device_name()`; a GPU not in the table says so and reports none (set
`train.peak_tflops`), and a CPU has none.

An encoder-decoder reads two sequences, so its count is the same rule applied to each side.
With S source and T target positions a batch (padded lengths: the keys attended over), L_e
encoder and L_d decoder layers, and its weights split by the tokens that pass through them,

    N_src = the encoder's weights + each cross-attention's key and value projections (which
            read the encoder's output, a source token at a time)
    N_tgt = the rest: the decoder's self-attention, its cross-attention's query and output
            projections, its feed-forward layers and the head,

a training batch costs

    src_tokens (6 N_src + 12 L_e d_attn S)  +  tgt_tokens (6 N_tgt + 12 L_d d_attn (T + S))

where the target's attention term counts its self-attention over T keys and its
cross-attention over the S source keys (the same two products, Q K^T and A V, forward and
backward), and src_tokens, tgt_tokens are the real tokens of each side (the padding left
out, as the Trainer counts target tokens). Kaplan et al. 2020 (table 1) count a forward pass
as 2N + 2 L n_ctx d_attn (Q K^T only); PaLM's appendix B counts both products, as here, so a
decoder-only run's figure is the one above with no source. The Trainer adds each batch's
count on the device (`MFU.add`, no wait) and reports the interval's FLOPs a target token
times its target tokens a second.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.config import ModelConfig
from attnkit.data.batch import Batch
from attnkit.nn.embedding import TokenEmbedding
from attnkit.nn.positional import AbsolutePositions

log = logging.getLogger(__name__)

# Dense bfloat16 tensor-core peaks in TFLOP/s (NVIDIA's data sheets, without sparsity), by a
# piece of the name torch.cuda.get_device_name() gives; the first that matches is taken, so
# the PCIe card comes before the SXM one it shares a name with.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM: "NVIDIA H100 80GB HBM3"
    ("H200", 989.0),
    ("A100", 312.0),
)


@dataclass(frozen=True)
class Peak:
    """A device's peak: `flops` a second (None where unknown) and the words that name it."""

    flops: float | None
    source: str


def device_peak(device: torch.device, given_tflops: float = 0.0) -> Peak:
    """The peak of `device`: `given_tflops` when set, else the table's figure for its name."""
    if given_tflops > 0:
        return Peak(given_tflops * 1e12, f"{given_tflops:g} TFLOP/s (train.peak_tflops)")
    if device.type != "cuda":
        return Peak(None, f"no peak for a {device.type} device")
    name = torch.cuda.get_device_name(device)
    for piece, tflops in PEAK_BF16_TFLOPS:
        if piece in name:
            return Peak(tflops * 1e12, f"{tflops:g} TFLOP/s, the bf16 peak of {name}")
    return Peak(None, f"the peak of {name} is unknown: set train.peak_tflops for MFU")


def _multiplied(model: nn.Module) -> list[tuple[str, nn.Parameter, bool]]:
    """Each weight a token multiplies, once, by its first name, and whether it is the head's."""
    tables = {
        id(p)
        for m in model.modules()
        if isinstance(m, TokenEmbedding | AbsolutePositions)
        for p in m.parameters(recurse=False)
    }
    head = getattr(model, "head", None)
    multiplied = {id(p) for p in head.parameters()} if isinstance(head, nn.Module) else set()
    seen: set[int] = set()
    kept = []
    for name, p in model.named_parameters():  # DTensors (FSDP) report the whole weight's numel
        if id(p) in seen or (id(p) in tables and id(p) not in multiplied):
            continue
        seen.add(id(p))
        kept.append((name, p, id(p) in multiplied))
    return kept


def multiplied_parameters(model: nn.Module) -> int:
    """N: the parameters every token multiplies (the token and position tables left out; a
    weight shared by a table and the head counted once, as the head's)."""
    return sum(p.numel() for _, p, _ in _multiplied(model))


def reads_the_source(name: str) -> bool:
    """Whether an encoder-decoder's weight `name` multiplies source tokens: the source side's
    own, and a cross-attention's key and value projection, which reads the encoder's output."""
    return name.startswith(("encoder.", "src_embed.")) or ".cross_attn.kv_proj." in name


def parameters_by_side(model: nn.Module) -> tuple[int, int]:
    """(N_src, N_tgt) of an encoder-decoder: the weights a source token passes through, and
    those a target token does (the head's always the target's, tied to a table or not)."""
    source = target = 0
    for name, p, is_head in _multiplied(model):
        if reads_the_source(name) and not is_head:
            source += p.numel()
        else:
            target += p.numel()
    return source, target


def flops_per_token(config: ModelConfig, parameters: int, length: int) -> float:
    """6 N + 12 L d_model T for a sequence of `length` tokens (the module's docstring)."""
    layers = (config.n_encoder_layers or 0) + (config.n_decoder_layers or 0)
    width = config.n_heads * config.head_dim
    return 6 * parameters + 12 * layers * width * length


def encoder_decoder_flops(
    config: ModelConfig,
    sides: tuple[int, int],
    tokens: tuple[float | Tensor, float | Tensor],
    lengths: tuple[int, int],
) -> float | Tensor:
    """The training FLOPs of an encoder-decoder batch: `sides` (N_src, N_tgt), `tokens` the
    real source and target tokens, `lengths` (S, T) the positions attended over:
    src_tokens (6 N_src + 12 L_e d S) + tgt_tokens (6 N_tgt + 12 L_d d (T + S))."""
    (n_src, n_tgt), (src_tokens, tgt_tokens), (s, t) = sides, tokens, lengths
    width = config.n_heads * config.head_dim
    source = 6 * n_src + 12 * config.n_encoder_layers * width * s
    target = 6 * n_tgt + 12 * config.n_decoder_layers * width * (t + s)
    return src_tokens * source + tgt_tokens * target


class MFU:
    """MFU of a training run: `of(tokens_per_s, length)` the share of `devices` x the peak
    (an encoder-decoder's by the batches given to `add` since the last call)."""

    def __init__(self, model: nn.Module, device: torch.device, devices: int, given: float) -> None:
        self.config: ModelConfig = model.config
        self.peak = device_peak(device, given)
        self.devices = devices
        self.parameters = multiplied_parameters(model)
        self.encoder_decoder = self.config.shape == "encoder-decoder"
        self.sides = parameters_by_side(model) if self.encoder_decoder else (0, 0)
        # An encoder-decoder's interval: its FLOPs and target tokens, summed on the device.
        self.sums = torch.zeros(2, dtype=torch.float64, device=device)
        self.reported = self.peak.flops is not None
        if self.peak.flops is None:
            log.info("MFU: %s", self.peak.source)
        elif self.encoder_decoder:
            log.info(
                "MFU: src_tokens (6 N_src + 12 L_e d S) + tgt_tokens (6 N_tgt + 12 L_d d (T + S)) "
                "FLOPs a batch (N_src = %.3gB, N_tgt = %.3gB multiplied weights) over %s x %d "
                "device(s)",
                self.sides[0] / 1e9,
                self.sides[1] / 1e9,
                self.peak.source,
                devices,
            )
        else:
            log.info(
                "MFU: 6N + 12 L d_model T FLOPs a token (N = %.3gB multiplied weights) over %s "
                "x %d device(s)",
                self.parameters / 1e9,
                self.peak.source,
                devices,
            )

    def add(self, batch: Batch) -> None:
        """Count an encoder-decoder's training batch (nothing for the other shapes)."""
        if not (self.reported and self.encoder_decoder):
            return
        src, tgt = batch.src, batch.tgt
        s, t = src.shape[1], tgt.shape[1] - 1  # a target reads all but its last token
        src_tokens = src.numel() if batch.src_mask is None else batch.src_mask.sum()
        tgt_tokens = tgt[:, 1:].numel() if batch.tgt_mask is None else batch.tgt_mask[:, 1:].sum()
        flops = encoder_decoder_flops(self.config, self.sides, (src_tokens, tgt_tokens), (s, t))
        self.sums[0] += flops
        self.sums[1] += tgt_tokens

    def of(self, tokens_per_s: float, length: int) -> float | None:
        """The share (0-1) of the peak that `tokens_per_s` over sequences of `length` uses (an
        encoder-decoder's: its target tokens a second, at the FLOPs a target token of the
        batches added since the last call)."""
        if not self.reported:
            return None
        if self.encoder_decoder:
            flops_sum, tokens = self.sums.tolist()
            self.sums.zero_()
            if tokens == 0:
                return None
            flops = flops_sum / tokens
        else:
            flops = flops_per_token(self.config, self.parameters, length)
        return tokens_per_s * flops / (self.peak.flops * self.devices)
