"""Meta-device initialisation on two gloo ranks, for `test_meta_init.py`.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m tests.train.meta_worker OUT

Each rank writes OUT/rankR.pt: the parameters of Llama 2 7B's shape built on meta and
sharded over the two ranks, whether every weight is this rank's half on meta, the process's
peak resident memory (`ru_maxrss`) after that, and of two small models (Llama's shape, and
GPT's with its head tied to its table) sharded from meta, drawn and trained two steps:
whether the losses are finite and the same on both ranks, and the head still tied.
"""

import math
import resource
import sys
from pathlib import Path

import torch
import torch.distributed as torch_dist

from attnkit.config import ModelConfig
from attnkit.data.batch import Batch
from attnkit.interop.llama import config_from_hf
from attnkit.train import Trainer
from attnkit.train import distributed as dist
from attnkit.train.meta_init import on_meta
from attnkit.train.parallel import Parallel
from attnkit.train.run_config import TrainSection

LLAMA_2_7B = {
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}


def sharded_7b(info: dist.DistInfo, out: Path) -> dict:
    model = on_meta(config_from_hf(LLAMA_2_7B))
    settings = TrainSection(out_dir=str(out), parallel="fsdp", device="cpu", precision="bf16")
    Parallel(settings, info, torch.device("cpu"), "bf16").shard(model)
    halves = all(
        p.is_meta and p.to_local().shape[0] == math.ceil(p.shape[0] / 2) for p in model.parameters()
    )
    parameters = sum(p.numel() for p in model.parameters())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"parameters": parameters, "halves": halves, "max_rss_bytes": rss}


def small_run(info: dist.DistInfo, out: Path, preset: str) -> dict:
    config = ModelConfig.from_preset(preset, n_decoder_layers=2, vocab_size=64)
    g = torch.Generator().manual_seed(info.rank)
    ids = torch.randint(5, 64, (2, 4, 16), generator=g)
    batches = [Batch(tgt=t, tgt_mask=torch.ones_like(t, dtype=torch.bool)) for t in ids]
    settings = TrainSection(
        out_dir=str(out / preset), steps=2, lr=1e-3, schedule="constant", warmup=0,
        log_every=1, save_every=100, device="cpu", parallel="fsdp", threads=1,
    )  # fmt: skip
    model = on_meta(config)
    result = Trainer(model, batches, train=settings).fit()
    tied = config.tie_embeddings == "none" or model.head.weight is model.embed.token.weight
    losses = torch.tensor([r["train_loss"] for r in result.history if "train_loss" in r])
    everyone = [torch.zeros_like(losses) for _ in range(info.world_size)]
    torch_dist.all_gather(everyone, losses)
    return {
        "small_losses_finite": bool(torch.isfinite(losses).all()) and len(losses) == 2,
        "ranks_agree": all(torch.equal(everyone[0], x) for x in everyone),
        "still_tied": tied,
    }


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    info = dist.setup("cpu")
    report = sharded_7b(info, out)
    for preset in ("llama-tiny", "gpt-tiny"):  # RoPE and an untied head; a tied head
        report[preset] = small_run(info, out, preset)
    torch.save(report, out / f"rank{info.rank}.pt")
    dist.teardown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
