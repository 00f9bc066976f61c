"""The 1B shape at the hardware's limit: decoding against the memory bandwidth, 8-bit weights,
training against the tensor cores' peak; each beside transformers on the same GPU (issue 55).

The shape is TinyLlama-1.1B's (the preset `tinyllama-1.1b`: 22 layers, d_model 2048, 32
heads over 4 key-value heads, SwiGLU 5,632, vocabulary 32,000), random weights; attnkit's
model is built on the meta device and drawn on the GPU (`attnkit.train.meta_init`), and the
peer is transformers' `LlamaForCausalLM` with the same weights (`attnkit.interop.save_hf`).

decode  greedy at batch 1, 8 and 64, prompts of 8 tokens and `--new-tokens` new ones, bf16,
        on attnkit's static cache (its step compiled, CUDA graphs) against transformers'
        `cache_implementation="static"` (which it compiles). Reported: tokens/s; the achieved
        bandwidth, bytes a step reads (every weight but the token table, plus the KV cache up
        to the step's position, on average) over the step's time, and its share of the GPU's
        peak (`BANDWIDTH`, by the GPU's name; others unknown); kernels a step and the share of
        the step's span with a kernel running, from torch.profiler (gaps are the host's).
int8    batch 1 with the linear layers' weights in int8 (`int8-weights`) and, on GPUs of
        compute capability 8.9 and up, in float8 (`fp8`), against bf16; with `--recipe-run`
        (a run folder of the Tiny Shakespeare GPU recipe, as gpu_checks.sh's `recipe` step
        leaves it) also its validation loss in each type.
train   steps of `--train-batch` x `--train-length` random tokens, bf16 autocast over float32
        weights, fused AdamW, clipping at 1: attnkit's Trainer (each Block compiled,
        `train.compile_scope = "block"`) against `LlamaForCausalLM` compiled whole in a plain
        loop. Reported: tokens/s, MFU (`attnkit.train.mfu`: 6N + 12 L d_model T FLOPs a token
        over the peak of the GPU's name) and the peak memory beside `bench/memory_plan.py`'s
        prediction for the run (DDP's plan on one GPU, bf16).

    python -m bench llm --device cuda [--parts decode int8 train] [--recipe-run DIR]
    python -m bench llm --device cpu      # a dry run on a tiny shape of the same architecture
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from transformers import LlamaForCausalLM

from attnkit.config import ModelConfig
from attnkit.data.batch import Batch
from attnkit.generation import generate
from attnkit.interop.hf import save_hf
from attnkit.models import TransformerModel
from attnkit.nn.compute_type import convert, refusal
from attnkit.train import Trainer
from attnkit.train.meta_init import materialize, on_meta
from attnkit.train.mfu import device_peak, flops_per_token, multiplied_parameters
from attnkit.train.run_config import TrainSection
from bench import memory_plan
from bench.harness import Result, finish, opening

# Peak memory bandwidth in TB/s by a piece of torch.cuda.get_device_name(); H100 PCIe and NVL
# cards have other figures and are not in the table.
BANDWIDTH = (("H200", 4.8), ("H100 80GB HBM3", 3.35))
TINY = {  # --device cpu: the architecture at a size a CPU dry run takes in seconds
    "n_decoder_layers": 2, "d_model": 64, "n_heads": 8, "n_kv_heads": 2, "d_ff": 128,
    "vocab_size": 256, "max_len": 256,
}  # fmt: skip
PROMPT = 8


def shape(device: str) -> ModelConfig:
    return ModelConfig.from_preset("tinyllama-1.1b", **(TINY if device == "cpu" else {}))


def hf_config(config: ModelConfig) -> dict:
    """The Hugging Face config of `config`'s shape, as `bench/memory_plan.py` reads one."""
    return {
        "hidden_size": config.d_model,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_decoder_layers,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_len,
    }


def twins(config: ModelConfig, device: str, dtype: torch.dtype) -> tuple[TransformerModel, ...]:
    """attnkit's model drawn from meta on `device`, and transformers' with the same weights."""
    torch.manual_seed(0)
    ours = on_meta(config)
    materialize(ours, torch.device(device))
    with tempfile.TemporaryDirectory() as folder:
        save_hf(ours, Path(folder) / "hf")
        peer = LlamaForCausalLM.from_pretrained(
            Path(folder) / "hf", torch_dtype=dtype, attn_implementation="sdpa"
        )
    peer.generation_config.eos_token_id = None  # every row decodes all its new tokens
    return ours.to(dtype).eval(), peer.to(device).eval()


def bandwidth(device: str) -> tuple[float | None, str]:
    if device != "cuda":
        return None, f"no peak bandwidth for a {device} device"
    name = torch.cuda.get_device_name()
    for piece, tbs in BANDWIDTH:
        if piece in name:
            return tbs * 1e12, f"{tbs} TB/s, the peak of {name}"
    return None, f"the peak bandwidth of {name} is unknown"


def step_bytes(model: torch.nn.Module, config: ModelConfig, batch: int, position: float) -> float:
    """Bytes a decoding step reads: every saved tensor but the token table (a step looks up
    `batch` rows of it), and keys and values of `position` earlier tokens in each layer."""
    seen, weights = set(), 0
    for name, t in model.state_dict().items():
        if "embed.token" in name or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        weights += t.numel() * t.element_size()
    kv = 2 * config.n_decoder_layers * config.n_kv_heads * config.head_dim * 2  # bf16 a token
    return weights + kv * batch * position


def timed(run: Callable[[], torch.Tensor], reps: int, device: str) -> tuple[float, torch.Tensor]:
    """Median seconds of `reps` runs after one warm-up (compilation), and the last output."""
    out, seconds = run(), []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        out = run()
        _sync(device)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), out


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def kernel_profile(run: Callable[[], object], steps: int, device: str) -> dict[str, float | str]:
    """Kernels a step and the share of the GPU's span with a kernel running, of one `run`."""
    if device != "cuda":
        return {"kernels a step": "none on a CPU"}
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        run()
        torch.cuda.synchronize()
    kernels = [e for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        return {"kernels a step": "none seen"}
    busy = sum(e.time_range.elapsed_us() for e in kernels)
    span = max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)
    return {"kernels a step": len(kernels) / steps, "GPU busy %": 100 * busy / max(span, 1)}


def decode_row(
    model: torch.nn.Module, peer: torch.nn.Module | None, config: ModelConfig, batch: int,
    args: argparse.Namespace, label: str,
) -> Result:  # fmt: skip
    """Greedy decoding at `batch` on the static cache: `model` against `peer` (if any)."""
    n, device = args.new_tokens, args.device
    torch.manual_seed(batch)
    prompt = torch.randint(5, config.vocab_size - 1, (batch, PROMPT), device=device)
    mask = torch.ones_like(prompt)

    def ours() -> torch.Tensor:
        out = generate(
            model, prompt, mask, cache_implementation="static", max_new_tokens=n, eos_token_id=()
        )
        return out.sequences[:, PROMPT:]

    def theirs() -> torch.Tensor:
        out = peer.generate(
            prompt, attention_mask=mask, max_new_tokens=n, do_sample=False,
            cache_implementation="static", pad_token_id=0,
        )  # fmt: skip
        return out[:, PROMPT:]

    with torch.inference_mode():
        t_ours, o_ours = timed(ours, args.reps, device)
        peak, _ = bandwidth(device)
        read = step_bytes(model, config, batch, PROMPT + n / 2) * n / t_ours
        extra: dict[str, float | str] = {"GB/s": read / 1e9}
        if peak:
            extra["% of peak bandwidth"] = 100 * read / peak
        extra |= kernel_profile(ours, n, device)
        t_peer = None
        if peer is not None:
            t_peer, o_peer = timed(theirs, args.reps, device)
            profile = kernel_profile(theirs, n, device)
            extra |= {f"transformers {k}": v for k, v in profile.items()}
            same = sum(int(torch.equal(a, b)) for a, b in zip(o_ours, o_peer, strict=True))
            extra["same tokens as transformers"] = f"{same}/{batch}"
    rate = batch * n
    result = Result(
        f"1B greedy batch {batch} {label}", "tokens/s", [rate / t_ours],
        None if t_peer is None else [rate / t_peer],
        "" if t_peer is None else "transformers static cache", extra=extra,
    )  # fmt: skip
    print(result.name, f"{rate / t_ours:,.1f} tokens/s", result.extra, flush=True)
    return result


def decode(ours: TransformerModel, peer: torch.nn.Module, args: argparse.Namespace) -> list:
    return [decode_row(ours, peer, ours.config, b, args, "bf16") for b in args.batches]


def weights_in_8_bits(ours: TransformerModel, args: argparse.Namespace) -> list[Result]:
    """Batch 1 with int8 (and float8) weights against bf16, and the recipe's validation loss
    in each type where `--recipe-run` names the recipe's run folder."""
    device = torch.device(args.device)
    types = [
        t for t in ("int8-weights", "fp8") if refusal(t, device) is None or args.device == "cpu"
    ]
    baseline = decode_row(ours, None, ours.config, 1, args, "bf16 (int8's baseline)")
    results = []
    for kind in types:
        model = _copy_of(ours, args.device)
        _convert(model, kind, args.device)
        result = decode_row(model, None, ours.config, 1, args, kind)
        result.peer, result.peer_name = baseline.ours, "bf16"
        results.append(result)
        del model
    if args.recipe_run is not None:
        results += recipe_quality(args, ["bf16", *types])
    return [baseline, *results]


def _copy_of(ours: TransformerModel, device: str) -> TransformerModel:
    """A fresh model with `ours`'s weights (a deep copy would take its compiled steps too)."""
    model = on_meta(ours.config)
    materialize(model, torch.device(device))
    model.load_state_dict(ours.state_dict())
    return model.to(torch.bfloat16).eval()


def _convert(model: TransformerModel, kind: str, device: str) -> None:
    """`convert`, which on a CPU (a dry run) is asked past its refusal of the GPU's types."""
    if device == "cpu":
        import attnkit.nn.compute_type as ct

        refuse, ct.refusal = ct.refusal, lambda compute_type, device: None
        try:
            convert(model, kind)
        finally:
            ct.refusal = refuse
    else:
        convert(model, kind)


def recipe_quality(args: argparse.Namespace, types: list[str]) -> list[Result]:
    """The Tiny Shakespeare GPU recipe's validation loss with its linear layers in each type."""
    from attnkit.evaluation.run import evaluate_run

    if not (args.recipe_run / "config.json").is_file():
        print(f"no run folder at {args.recipe_run}: run gpu_checks.sh's recipe step first")
        return []
    losses = {}
    kinds = types if args.device == "cuda" else ["float32"]  # a dry run: the CPU's own type
    for kind in kinds:
        evaluation = evaluate_run(
            args.recipe_run, device=args.device, compute_type=kind, split="val", batch_size=64
        )
        losses[kind] = next(s.value for s in evaluation.scores if s.name == "loss")
        print(f"recipe validation loss, {kind}: {losses[kind]:.4f}", flush=True)
    base = losses.get(kinds[0])
    return [
        Result(
            f"Tiny Shakespeare recipe validation loss, {kind}",
            "loss",
            [loss],
            None if base is None else [base],
            kinds[0],
            higher_is_better=False,
            extra={} if base is None else {"difference": loss - base},
        )
        for kind, loss in losses.items()
    ]


def lm_batches(config: ModelConfig, args: argparse.Namespace, steps: int) -> list[Batch]:
    g = torch.Generator().manual_seed(0)
    shape = (args.train_batch, args.train_length + 1)
    ids = [torch.randint(5, config.vocab_size, shape, generator=g) for _ in range(steps)]
    return [Batch(tgt=t, tgt_mask=torch.ones_like(t, dtype=torch.bool)) for t in ids]


def train_ours(config: ModelConfig, args: argparse.Namespace, out: Path) -> dict[str, float]:
    """attnkit's Trainer on the 1B shape drawn from meta; tokens/s and MFU of its records
    after the first window (compilation), and the peak memory."""
    steps = args.train_steps + args.window
    settings = TrainSection(
        out_dir=str(out), steps=steps, lr=3e-4, schedule="constant", warmup=0, beta2=0.95,
        eps=1e-8, weight_decay=0.1, clip_norm=1.0, precision="bf16" if args.device == "cuda"
        else "fp32", compile=args.device == "cuda", compile_scope="block",
        log_every=args.window, save_every=steps, device=args.device, keep_last=1,
        peak_tflops=args.peak_tflops,
    )  # fmt: skip
    _reset_memory(args.device)
    torch.manual_seed(0)
    result = Trainer(on_meta(config), lm_batches(config, args, steps), train=settings).fit()
    records = [r for r in result.history if "tokens_per_s" in r][1:]
    out_of = {"tokens/s": statistics.median(r["tokens_per_s"] for r in records)}
    if all("mfu" in r for r in records):
        out_of["MFU %"] = 100 * statistics.median(r["mfu"] for r in records)
    out_of["peak GB"] = _peak_memory(args.device)
    return out_of


def train_peer(config: ModelConfig, args: argparse.Namespace) -> dict[str, float]:
    """transformers' LlamaForCausalLM, compiled whole, in a plain loop: tokens/s and memory."""
    torch.manual_seed(0)
    hf = transformers.LlamaConfig(
        **hf_config(config), rms_norm_eps=config.norm_eps, tie_word_embeddings=False,
        attn_implementation="sdpa",
    )  # fmt: skip
    with torch.device(args.device):  # drawn where it trains: no host copy of 4.4 GB
        model = LlamaForCausalLM(hf).train()
    _reset_memory(args.device)
    fused = args.device == "cuda"
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=fused
    )
    forward = torch.compile(model) if args.device == "cuda" else model
    batches = lm_batches(config, args, args.window + args.train_steps)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    marks = []
    for step, batch in enumerate(batches):
        if step % args.window == 0:
            _sync(args.device)
            marks.append(time.perf_counter())
        ids = batch.tgt.to(args.device)
        with torch.autocast(args.device, dtype=dtype, enabled=args.device == "cuda"):
            loss = forward(input_ids=ids[:, :-1], labels=ids[:, :-1]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    _sync(args.device)
    marks.append(time.perf_counter())
    tokens = args.window * args.train_batch * args.train_length
    rates = [tokens / (b - a) for a, b in itertools.pairwise(marks[1:])]  # compiled: the first
    return {"tokens/s": statistics.median(rates), "peak GB": _peak_memory(args.device)}


def _reset_memory(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_memory(device: str) -> float:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 1e9
    from bench.harness import peak_rss_mib

    return peak_rss_mib() * 2**20 / 1e9


def train(config: ModelConfig, args: argparse.Namespace) -> list[Result]:
    with tempfile.TemporaryDirectory() as out:
        ours = train_ours(config, args, Path(out) / "run")
    theirs = train_peer(config, args)
    tokens = args.train_batch * args.train_length
    hf = hf_config(config)
    plan = memory_plan.Plan("ddp", "none", False, "bf16")
    acts = memory_plan.measure_activations(hf)["bf16"]
    predicted = memory_plan.per_gpu(memory_plan.count(hf), acts, plan, 1, tokens) / 1e9
    peak = device_peak(torch.device(args.device), args.peak_tflops)
    n = multiplied_parameters(on_meta(config))
    flops = flops_per_token(config, n, args.train_length)
    extra: dict[str, float | str] = {
        "MFU %": ours.get("MFU %", "none: " + peak.source),
        "peak GB": ours["peak GB"],
        "memory plan GB": predicted,
        "transformers peak GB": theirs["peak GB"],
    }
    if peak.flops:
        extra["transformers MFU %"] = 100 * theirs["tokens/s"] * flops / peak.flops
    how = "bf16, compiled, fused AdamW" if args.device == "cuda" else "a CPU's dry run"
    result = Result(
        f"1B training, {tokens:,} tokens a step, {how}", "tokens/s",
        [ours["tokens/s"]], [theirs["tokens/s"]], "transformers LlamaForCausalLM loop",
        extra=extra,
    )  # fmt: skip
    print(result.name, result.extra, flush=True)
    return [result]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench llm", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda; cpu: a dry run on a tiny shape")
    parser.add_argument("--parts", nargs="+", default=["decode", "int8", "train"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--recipe-run", type=Path, default=None, help="the recipe's run folder")
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--train-length", type=int, default=2048)
    parser.add_argument("--train-steps", type=int, default=20, help="timed, after a window")
    parser.add_argument("--window", type=int, default=10, help="steps a timed window")
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="0: by the GPU's name")
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "python -m bench llm --device cuda needs a CUDA device; --device cpu tries it"
        )
    torch.backends.cuda.matmul.allow_tf32 = True
    config = shape(args.device)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "no GPU"
    header = opening(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {gpu}",
        f"{bandwidth(args.device)[1]}; {device_peak(torch.device(args.device)).source}",
    )
    results: list[Result] = []
    if {"decode", "int8"} & set(args.parts):
        ours, peer = twins(config, args.device, torch.bfloat16)
        if "decode" in args.parts:
            results += decode(ours, peer, args)
        del peer
        if "int8" in args.parts:
            results += weights_in_8_bits(ours, args)
        del ours
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if "train" in args.parts:
        results += train(config, args)
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
