"""Training throughput: tokens/s of forward + backward + optimizer step, ours and a peer's.

(a) decoder-only, GPT-2 shaped (6 layers, d_model 512, 8 heads, vocab 8,000),
    batch 16 x 256, against transformers' GPT2LMHeadModel of the same shape;
(b) encoder-decoder, paper-base shape with vocab 8,000, batch 32, source and
    target length 32, against torch.nn.Transformer with the same embeddings and head;
(c) nanoGPT's Tiny Shakespeare CPU recipe (4 layers, 4 heads, d_model 128,
    block 64, batch 12, 65 characters) against a nanoGPT-style model.

Each runs in a mode: fp32, bf16 (autocast), or compile (fp32, both sides'
models wrapped in torch.compile; compilation happens in the warm-up).
Printed after the machine's matmul peaks (bench/peak.py), and written to
bench/results/train.json and .md.

Both sides use dropout 0 (so neither pays for dropout the other skips), the
same AdamW settings, and the same random batch. Model FLOPs per step are
counted once by torch's FlopCounterMode on our side (forward and backward;
the two sides compute the same products) and give the achieved GFLOP/s and
the model FLOP utilisation against the measured matmul peak. In float32, the
time torch's profiler finds in our step's matrix products gives a ceiling: the
ratio we would reach if every product ran at that peak and the rest of the
step took as long as it does. Both sides of
every benchmark run in this one process, with the same threads and allocator:
glibc's default, or with `--reuse-freed-memory` the setting `attnkit train`
makes on a CPU (`attnkit/train/host_memory.py`), which then applies to both.

    python -m bench train --reps 3 --steps 2 [--bf16] [--compile] [gpt seq2seq nanogpt]
    python -m bench train --device cuda        # on a GPU: bench/train_gpu.py
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from attnkit import DecoderOnly, EncoderDecoder, ModelConfig
from attnkit.data.batch import Batch
from attnkit.models.base import unwrap
from attnkit.train import objective_for
from attnkit.train.host_memory import reuse_freed_memory
from bench.harness import (
    RESULTS,
    Result,
    alternate,
    finish,
    markdown_row,
    opening,
    peak_rss_mib,
    rss_in_subprocess,
    seconds_per_call,
)
from bench.peak import matmul_peaks

Step = Callable[[], torch.Tensor]  # one training step; returns the loss


@dataclass
class Work:
    name: str
    peer_name: str
    tokens: int  # tokens processed per step (what tokens/s counts)
    ours: Callable[[], Step]  # builds our model and returns its training step
    peer: Callable[[], Step]


def _trainer(model: torch.nn.Module, loss: Callable[[], torch.Tensor], mode: str) -> Step:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)

    def step() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
            value = loss()
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
        return value

    return step


def _prepare(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    """The model in training mode, compiled (inductor, default options) in the compile mode."""
    model = model.train()
    return torch.compile(model) if mode == "compile" else model


def _objective_loss(model: torch.nn.Module, batch: Batch) -> Callable[[], torch.Tensor]:
    """Our side's loss as `attnkit train` computes it: the task's objective (a fused head and
    cross-entropy), mean over the predicted tokens."""
    objective = objective_for(unwrap(model).config.shape)

    def loss() -> torch.Tensor:
        terms = objective(model, batch)
        return terms.total / terms.tokens

    return loss


def gpt_work(mode: str = "fp32") -> Work:
    from transformers import GPT2LMHeadModel

    from bench.peers.hf_models import gpt2_config

    batch, length, vocab = 16, 256, 8000
    ids = torch.randint(vocab, (batch, length + 1))

    def ours() -> Step:
        model = DecoderOnly(
            ModelConfig.from_preset(
                "gpt2-small",
                vocab_size=vocab,
                d_model=512,
                n_heads=8,
                n_decoder_layers=6,
                d_ff=2048,
                max_len=length + 1,
                dropout=0.0,
                embedding_dropout=0.0,
            )
        )
        model = _prepare(model, mode)
        return _trainer(model, _objective_loss(model, Batch(tgt=ids)), mode)

    def peer() -> Step:
        model = _prepare(GPT2LMHeadModel(gpt2_config(6, 512, 8, vocab, length + 1)), mode)
        return _trainer(model, lambda: model(ids[:, :-1], labels=ids[:, :-1]).loss, mode)

    return Work(
        "train (a) GPT-2 shape 16x256" + _suffix(mode),
        "transformers GPT2LMHeadModel",
        batch * length,
        ours,
        peer,
    )


def seq2seq_work(mode: str = "fp32") -> Work:
    from bench.peers.torch_transformer import TorchSeq2Seq

    batch, length, vocab = 32, 32, 8000
    src = torch.randint(vocab, (batch, length))
    tgt = torch.randint(vocab, (batch, length + 1))

    def ours() -> Step:
        config = ModelConfig.from_preset(
            "paper-base", vocab_size=vocab, dropout=0.0, embedding_dropout=0.0, max_len=64
        )
        model = _prepare(EncoderDecoder(config), mode)
        return _trainer(model, _objective_loss(model, Batch(src=src, tgt=tgt)), mode)

    def peer() -> Step:
        model = _prepare(TorchSeq2Seq(vocab, 512, 8, 6, 2048, 64), mode)

        def loss() -> torch.Tensor:
            logits = model(src, tgt[:, :-1])
            return F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())

        return _trainer(model, loss, mode)

    return Work(
        "train (b) paper-base 32x32x32" + _suffix(mode),
        "torch.nn.Transformer",
        batch * length * 2,  # source and target tokens
        ours,
        peer,
    )


def nanogpt_work(mode: str = "fp32") -> Work:
    from bench.peers.nanogpt import NanoGPT

    batch, block, vocab = 12, 64, 65
    ids = torch.randint(vocab, (batch, block + 1))

    def ours() -> Step:
        config = ModelConfig.from_preset("gpt-tiny", vocab_size=vocab, max_len=block)
        model = _prepare(DecoderOnly(config), mode)
        return _trainer(model, _objective_loss(model, Batch(tgt=ids)), mode)

    def peer() -> Step:
        model = _prepare(NanoGPT(vocab, block, 4, 4, 128), mode)
        return _trainer(model, lambda: model(ids[:, :-1], ids[:, 1:]), mode)

    return Work(
        "train (c) nanoGPT Shakespeare-char 12x64" + _suffix(mode),
        "nanoGPT-style model",
        batch * block,
        ours,
        peer,
    )


def _suffix(mode: str) -> str:
    return {"fp32": "", "bf16": " bf16", "compile": " torch.compile"}[mode]


WORKS = {"gpt": gpt_work, "seq2seq": seq2seq_work, "nanogpt": nanogpt_work}


def _onednn_linear_flops(x_shape, weight_shape, *_, **__) -> int:
    """x W^T through oneDNN (`kernels/onednn.py`): 2 (rows x in x out), as torch counts mm."""
    return 2 * math.prod(x_shape[:-1]) * weight_shape[0] * weight_shape[1]


def _addmm_flops(_, a_shape, b_shape, *__, **___) -> int:
    """C += A B in place (the fused loss's dL/dW, `attnkit/train/cross_entropy.py`)."""
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


def _attention_flops(q_shape, k_shape, v_shape, *_, **__) -> int:
    """The CPU flash kernel's forward, counted as torch counts its GPU kernels'."""
    return sdpa_flop_count(q_shape, k_shape, v_shape)


def _attention_backward_flops(grad_shape, q_shape, k_shape, v_shape, *_, **__) -> int:
    """The CPU flash kernel's backward, likewise."""
    return sdpa_backward_flop_count(grad_shape, q_shape, k_shape, v_shape)


def step_flops(step: Step) -> dict[str, int]:
    """Floating-point operations of one training step, per operator (matmuls, attention).

    torch's counter knows aten's products and its GPU attention kernels; oneDNN's
    linear (which our side runs on AVX-512 CPUs), the in-place `addmm_` and the
    CPU flash attention kernel are added, or what they compute would go
    uncounted. Attention counts every score, causal or not, as the matmuls of an
    eager peer do. The step counted is the second: the first may probe kernels
    (`attnkit/kernels/onednn.py`), whose products are no part of training.
    """
    step()
    aten = torch.ops.aten
    kernels = {
        torch.ops.mkldnn._linear_pointwise: _onednn_linear_flops,
        aten.addmm_: _addmm_flops,
        aten._scaled_dot_product_flash_attention_for_cpu: _attention_flops,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _attention_backward_flops,
    }
    with FlopCounterMode(display=False, custom_mapping=kernels) as counter:
        step()
    return {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}


def _products(flops: dict[str, int]) -> dict[str, int]:
    """The matrix products among `step_flops`' operators: all but the attention kernels."""
    return {op: n for op, n in flops.items() if "attention" not in op}


def products_seconds(step: Step, steps: int, flops: dict[str, int]) -> float:
    """Seconds a step spends in the matrix products counted in `flops` (torch's profiler).

    Their self times are taken as they are: a product is one long event, which the
    profiler barely slows, where the rest of the step is many short ones.
    """
    # The counter names an operator aten.mm, the profiler aten::mm.
    names = {op.replace(".", "::", 1) for op in _products(flops)}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        for _ in range(steps):
            step()
    events = profile.key_averages()
    return sum(e.self_cpu_time_total for e in events if e.key in names) / 1e6 / steps


def add_ceiling(
    result: Result, flops: dict[str, int], products_s: float, tokens: int, peak: float
) -> None:
    """Add what our ratio would be if every matrix product of our step ran at `peak` GFLOP/s
    and the rest of the step took as long as it does: how far kernels alone could go."""
    step = tokens / result.ours_median
    products = sum(_products(flops).values())
    at_peak = step - products_s + products / (peak * 1e9)
    result.extra["products' share"] = f"{products_s / step:.0%}"
    result.extra["products GFLOP/s"] = products / products_s / 1e9
    result.extra["ratio with products at peak"] = f"{step / at_peak * result.ratio:.2f}x"


def _tokens_per_second(step: Step, tokens: int, steps: int) -> Callable[[], float]:
    seconds = seconds_per_call(step, steps)
    return lambda: tokens / seconds()


def run(
    name: str, mode: str, peaks: dict[str, float], reps: int, steps: int, memory: bool
) -> Result:
    work = WORKS[name](mode)
    our_step, peer_step = work.ours(), work.peer()
    # FLOPs are counted in eager mode: the compiled step computes the same products.
    by_op = step_flops(WORKS[name]("fp32").ours() if mode == "compile" else our_step)
    flops = sum(by_op.values())
    ours, peer = alternate(
        _tokens_per_second(our_step, work.tokens, steps),
        _tokens_per_second(peer_step, work.tokens, steps),
        reps=reps,
    )
    result = Result(work.name, "tokens/s", ours, peer, work.peer_name)
    achieved = flops / work.tokens * result.ours_median / 1e9
    fp32_peak = max(v for k, v in peaks.items() if k.startswith("float32"))
    result.extra["GFLOP/s"] = achieved
    result.extra["MFU vs fp32 peak"] = f"{achieved / fp32_peak:.0%}"
    result.extra["peer GFLOP/s"] = flops / work.tokens * result.peer_median / 1e9
    if mode == "bf16":
        result.extra["MFU vs bf16 peak"] = f"{achieved / peaks['bfloat16']:.0%}"
    if mode == "fp32":
        products_s = products_seconds(our_step, steps, by_op)
        add_ceiling(result, by_op, products_s, work.tokens, fp32_peak)
    if memory:
        result.extra["peak RSS MiB"] = rss_in_subprocess(
            "bench.training", "--rss", name, "ours", mode
        )
        result.extra["peer peak RSS MiB"] = rss_in_subprocess(
            "bench.training", "--rss", name, "peer", mode
        )
    return result


def peak_memory(name: str, side: str, mode: str) -> float:
    """Peak resident MiB of three training steps of one side, alone in this process."""
    work = WORKS[name](mode)
    step = work.ours() if side == "ours" else work.peer()
    for _ in range(3):
        step()
    return peak_rss_mib()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench train", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--device", default="cpu", help="cpu; cuda runs bench/train_gpu.py (its own options)"
    )
    parser.add_argument("names", nargs="*", default=list(WORKS), help=f"of {', '.join(WORKS)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3, help="alternating repetitions per side")
    parser.add_argument("--steps", type=int, default=2, help="training steps per repetition")
    parser.add_argument("--bf16", action="store_true", help="also run each benchmark in bf16")
    parser.add_argument(
        "--compile", action="store_true", help="also run each with torch.compile on both sides"
    )
    parser.add_argument(
        "--reuse-freed-memory",
        action="store_true",
        help="keep freed memory in the process, as `attnkit train` does (both sides)",
    )
    parser.add_argument(
        "--no-memory", dest="memory", action="store_false", help="skip the peak-RSS subprocesses"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "train", help="OUT.json, OUT.md")
    parser.add_argument(
        "--rss", nargs=3, metavar=("NAME", "SIDE", "MODE"), help="internal: one side's memory"
    )
    args = parser.parse_args(argv)
    if args.rss:
        print(peak_memory(*args.rss))
        return
    torch.set_num_threads(args.threads)
    if args.reuse_freed_memory and not reuse_freed_memory():
        parser.error("--reuse-freed-memory needs glibc (Linux)")
    allocator = "freed memory kept" if args.reuse_freed_memory else "glibc default"
    peaks = matmul_peaks()
    header = opening(
        f"{args.threads} threads, allocator {allocator}",
        "matmul peaks: " + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items()),
    )
    modes = ["fp32", *(["bf16"] if args.bf16 else []), *(["compile"] if args.compile else [])]
    results = []
    for name in args.names:
        for mode in modes:
            results.append(run(name, mode, peaks, args.reps, args.steps, args.memory))
            print(markdown_row(results[-1]), flush=True)
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
