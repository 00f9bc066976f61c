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
`train.peak_tflops`), and a CPU has none. An encoder-decoder's cost depends on the source
lengths as well as the target tokens the Trainer counts, so only the decoder-only and
encoder-only shapes report MFU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from attnkit.config import ModelConfig
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


def multiplied_parameters(model: nn.Module) -> int:
    """N: the parameters every token multiplies (the token and position tables left out; a
    weight shared by a table and the head counted once, as the head's)."""
    tables = {
        id(p)
        for m in model.modules()
        if isinstance(m, TokenEmbedding | AbsolutePositions)
        for p in m.parameters(recurse=False)
    }
    head = getattr(model, "head", None)
    multiplied = {id(p) for p in head.parameters()} if isinstance(head, nn.Module) else set()
    seen: set[int] = set()
    total = 0
    for p in model.parameters():  # DTensors (FSDP) report the whole weight's numel
        if id(p) in seen or (id(p) in tables and id(p) not in multiplied):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def flops_per_token(config: ModelConfig, parameters: int, length: int) -> float:
    """6 N + 12 L d_model T for a sequence of `length` tokens (the module's docstring)."""
    layers = (config.n_encoder_layers or 0) + (config.n_decoder_layers or 0)
    width = config.n_heads * config.head_dim
    return 6 * parameters + 12 * layers * width * length


class MFU:
    """MFU of a training run: `of(tokens_per_s, length)` the share of `devices` x the peak."""

    def __init__(self, model: nn.Module, device: torch.device, devices: int, given: float) -> None:
        self.config: ModelConfig = model.config
        self.peak = device_peak(device, given)
        self.devices = devices
        self.parameters = multiplied_parameters(model)
        self.reported = self.config.shape != "encoder-decoder" and self.peak.flops is not None
        if self.config.shape == "encoder-decoder":
            log.debug("no MFU for an encoder-decoder (its cost depends on the source lengths)")
        elif self.peak.flops is None:
            log.info("MFU: %s", self.peak.source)
        else:
            log.info(
                "MFU: 6N + 12 L d_model T FLOPs a token (N = %.3gB multiplied weights) over %s "
                "x %d device(s)",
                self.parameters / 1e9,
                self.peak.source,
                devices,
            )

    def of(self, tokens_per_s: float, length: int) -> float | None:
        """The share (0-1) of the peak that `tokens_per_s` over sequences of `length` uses."""
        if not self.reported:
            return None
        flops = flops_per_token(self.config, self.parameters, length)
        return tokens_per_s * flops / (self.peak.flops * self.devices)
