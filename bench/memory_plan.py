"""Memory per GPU of training 1B, 7B and 8x7B models, on paper (issue 41, item 5).

    python -m bench memory                   # the table of docs/explanation/memory.md
    python -m bench memory --tokens 8192     # another micro-batch per GPU

The parameter counts are those of attnkit's own models, built on the meta device (no
memory) from the Hugging Face configs of Llama 3.2 1B, Llama 2 7B and Mixtral 8x7B. Per GPU,
with N ranks, P parameters, T of them trained (T = P, or LoRA's factors), the largest Block
P_b and the rest P_r (embeddings, final norm, head):

    DDP    4P (float32 weights) + 4T (gradients) + 4T (DDP's all-reduce buckets, on more than
           one GPU) + 8T (AdamW)
           + 2P with bf16 (autocast's bf16 copies of the weights, kept for backward)
    FSDP   (4P + 4T + 8T) / N  (each rank's slices)
           + w P_r + (w + g) 2 P_b  (gathered whole: the root through forward and backward,
             two Blocks at a time, one running and one prefetched); w = 4 bytes a weight in
             fp32, 2 gathered in bf16; g = 4 bytes a gradient before its reduce-scatter, 6 in
             bf16 (a bf16 gradient and its float32 copy for the reduction); g = 0 when frozen

Activations, for t tokens a GPU (the micro-batch) and L Blocks:

    none   t (L a + o)              a: bytes a token a Block keeps for backward, o: outside them
    block  t (L 4 d_model + a + o)  each Block keeps its float32 input, and one is recomputed

a and o are measured, not guessed: the bytes of the tensors attnkit's Block saves for
backward (`torch.autograd.graph.saved_tensors_hooks`, the tensors that scale with the
tokens) at 1/8 and 1/4 of each model's width (the same head size, ratios and experts),
extrapolated to its full width along the line they lie on. With `bf16` they are those of
autocast over float32 weights (DDP's); under FSDP's bf16 gathering the residual stream is
bf16 too, so the figure is an upper bound there. Not counted: the CUDA context and
allocator slack (about 1-3 GB), NCCL's buffers, the logits (attnkit's fused loss never
holds them whole). A GPU of 80 GB is taken to hold what needs at most 72 GB.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass

import torch

from attnkit.data.batch import Batch
from attnkit.interop.llama import config_from_hf
from attnkit.models import build_model
from attnkit.models.block import Block
from attnkit.nn.lora import apply_lora
from attnkit.train.objectives import objective_for

GB = 1e9
FITS = 72 * GB  # of an 80 GB GPU
LORA_RANK = 16

# The Hugging Face configs (config.json) of the three models, as `attnkit import hf` reads them.
MODELS = {
    "1B": (
        "Llama 3.2 1B",
        {
            "hidden_size": 2048,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "vocab_size": 128256,
            "tie_word_embeddings": True,
            "max_position_embeddings": 8192,
        },
    ),
    "7B": (
        "Llama 2 7B",
        {
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "intermediate_size": 11008,
            "num_hidden_layers": 32,
            "vocab_size": 32000,
            "max_position_embeddings": 4096,
        },
    ),
    "8x7B": (
        "Mixtral 8x7B",
        {
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "vocab_size": 32000,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "max_position_embeddings": 32768,
        },
    ),
}


@dataclass(frozen=True)
class Counts:
    """A model's parameters: all, trained with LoRA, in its largest Block, outside the Blocks."""

    params: int
    lora: int
    block: int
    root: int
    layers: int
    d_model: int


@dataclass(frozen=True)
class Activations:
    """Bytes a token costs for backward: in each Block (`per_block`) and outside them."""

    per_block: float
    outside: float


@dataclass(frozen=True)
class Plan:
    """One way to train: `parallel` (ddp, fsdp), activation checkpointing, LoRA, precision."""

    parallel: str
    checkpointing: str
    lora: bool
    precision: str

    @property
    def name(self) -> str:
        parts = [self.parallel.upper()]
        if self.checkpointing != "none":
            parts.append("AC")
        if self.lora:
            parts.append("LoRA")
        return " + ".join(parts)


PLANS = [
    Plan(parallel, checkpointing, lora, precision)
    for precision in ("fp32", "bf16")
    for parallel, checkpointing, lora in (
        ("ddp", "none", False),
        ("fsdp", "none", False),
        ("fsdp", "block", False),
        ("fsdp", "block", True),
    )
]


def count(hf: dict) -> Counts:
    """The parameters of attnkit's model of `hf`, built on the meta device."""
    with torch.device("meta"):
        model = build_model(config_from_hf(hf))
        params = model.num_parameters()
        blocks = [m for m in model.modules() if isinstance(m, Block)]
        block = max(sum(p.numel() for p in b.parameters()) for b in blocks)
        inside = sum(p.numel() for b in blocks for p in b.parameters())
        apply_lora(model, rank=LORA_RANK, alpha=2 * LORA_RANK)
        lora = model.num_parameters(trainable_only=True)
    return Counts(params, lora, block, params - inside, len(blocks), hf["hidden_size"])


def _saved_bytes(model: torch.nn.Module, tokens: int, bf16: bool) -> int:
    """Bytes of the tensors one forward pass saves for backward (parameters left out)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(5, model.config.vocab_size, (1, tokens))
    batch = Batch(None, None, ids, torch.ones_like(ids, dtype=torch.bool))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        objective_for("decoder")(model, batch)
    return sum(saved.values())


def measure_activations(hf: dict) -> dict[str, Activations]:
    """a and o of the docstring for fp32 and bf16: slopes over tokens and Blocks, at 1/8 and
    1/4 of the width of `hf` (heads of the same size), extrapolated to its full width."""
    points: dict[str, list[tuple[float, float]]] = {"fp32": [], "bf16": []}
    for scale in (8, 4):
        small = {
            **hf,
            "vocab_size": 256,
            "hidden_size": hf["hidden_size"] // scale,
            "num_attention_heads": hf["num_attention_heads"] // scale,
            "num_key_value_heads": max(1, hf["num_key_value_heads"] // scale),
            "intermediate_size": hf["intermediate_size"] // scale,
        }
        torch.manual_seed(0)
        models = {n: build_model(config_from_hf({**small, "num_hidden_layers": n})) for n in (1, 2)}
        for precision, bf16 in (("fp32", False), ("bf16", True)):
            per_token = {
                n: (_saved_bytes(m, 128, bf16) - _saved_bytes(m, 64, bf16)) / 64
                for n, m in models.items()
            }
            points[precision].append((per_token[2] - per_token[1], 2 * per_token[1] - per_token[2]))
    # Each is a constant (the head size's share) plus a part in proportion to the width.
    return {
        precision: Activations(b8 + 7 * (b4 - b8), o8 + 7 * (o4 - o8))
        for precision, ((b8, o8), (b4, o4)) in points.items()
    }


def per_gpu(counts: Counts, acts: Activations, plan: Plan, ranks: int, tokens: int) -> float:
    """Bytes a GPU needs for `plan` on `ranks` GPUs with `tokens` a micro-batch."""
    p, bf16 = counts.params, plan.precision == "bf16"
    t = counts.lora if plan.lora else p
    if plan.parallel == "ddp":  # alone, attnkit wraps nothing: no buckets
        states = 4 * p + (16 if ranks > 1 else 12) * t + (2 * p if bf16 else 0)
    else:
        w, g = (2, 6) if bf16 else (4, 4)
        frozen = plan.lora  # the Blocks' weights get no gradient; the factors' are negligible
        states = (4 * p + 12 * t) / ranks
        states += (w + (0 if frozen else g)) * counts.root + (w + (0 if frozen else g)) * 2 * (
            counts.block
        )
    kept = acts.per_block if plan.checkpointing == "none" else 4 * counts.d_model
    recomputed = acts.per_block if plan.checkpointing != "none" else 0
    return states + tokens * (counts.layers * kept + recomputed + acts.outside)


def table(tokens: int, ranks: tuple[int, ...] = (1, 8, 16)) -> list[str]:
    header = [
        "model",
        "params",
        "plan",
        "precision",
        *(f"{n} GPU{'s' if n > 1 else ''}" for n in ranks),
    ]
    rows = ["| " + " | ".join(header) + " |", "|" + " --- |" * 4 + " ---: |" * len(ranks)]
    for size, (name, hf) in MODELS.items():
        counts = count(hf)
        acts = measure_activations(hf)
        for plan in PLANS:
            cells = []
            for n in ranks:
                gb = per_gpu(counts, acts[plan.precision], plan, n, tokens) / GB
                cells.append(f"{gb:,.1f} {'yes' if gb * GB <= FITS else 'no'}")
            params = f"{counts.params / 1e9:.2f}B" + (
                f" ({counts.lora / 1e6:.1f}M trained)" if plan.lora else ""
            )
            rows.append(
                f"| {size} {name} | {params} | {plan.name} | {plan.precision} | "
                + " | ".join(cells)
                + " |"
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="tokens a GPU, per micro-batch")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(
        f"memory per GPU in GB (1e9 bytes), 'yes' where it is at most {FITS / GB:.0f} GB of an "
        f"80 GB GPU; {args.tokens} tokens a GPU a micro-batch; LoRA of rank {LORA_RANK} on the "
        "attention projections; AdamW in float32\n"
    )
    print("\n".join(table(args.tokens)))


if __name__ == "__main__":
    main()
