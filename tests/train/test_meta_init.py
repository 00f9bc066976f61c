"""Meta-device initialisation (`attnkit.train.meta_init`): built without memory, then drawn as
a normal build draws (one process), and sharded before it is drawn on two gloo ranks."""

import pytest
import torch

from attnkit.config import ModelConfig
from attnkit.data.batch import Batch
from attnkit.errors import AttnkitError
from attnkit.models import build_model
from attnkit.tokenizer import Tokenizer
from attnkit.train import Trainer
from attnkit.train.meta_init import is_on_meta, materialize, on_meta
from attnkit.train.run_config import RunConfig, TrainSection
from attnkit.train.run_model import run_model
from tests.helpers import RUN_LINES, VOCAB, run_worker, tiny_config

TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


@pytest.mark.parametrize(
    "config",
    [
        ModelConfig.from_preset("llama-tiny", n_decoder_layers=2),  # RoPE tables, untied head
        ModelConfig.from_preset("gpt-tiny", n_decoder_layers=2, init="gpt2"),  # learned, tied
        tiny_config("encoder-decoder"),  # sinusoidal positions, Glorot
        tiny_config("encoder", positional="alibi"),
    ],
    ids=["llama", "gpt", "encoder-decoder", "alibi-encoder"],
)
def test_meta_init_gives_the_weights_and_forward_of_a_normal_build_with_the_same_seed(config):
    torch.manual_seed(5)
    normal = build_model(config).eval()
    model = on_meta(config)
    assert is_on_meta(model) and all(p.is_meta for p in model.parameters())
    assert not any(b.is_meta for b in model.buffers())  # RoPE's tables are computed
    torch.manual_seed(5)
    materialize(model, torch.device("cpu"))
    assert not is_on_meta(model)
    for (name, got), (_, want) in zip(
        model.state_dict().items(), normal.state_dict().items(), strict=True
    ):
        assert torch.equal(got, want), name
    for (name, got), (_, want) in zip(model.named_buffers(), normal.named_buffers(), strict=True):
        assert torch.equal(got, want), name
    if config.tie_embeddings != "none" and config.shape == "decoder":
        assert model.head.weight is model.embed.token.weight
    ids = torch.randint(5, min(config.vocab_size, 24), (2, 9))
    model.eval()
    if config.shape == "encoder-decoder":
        got, want = model(ids, ids).logits, normal(ids, ids).logits
    else:
        got, want = model(ids).logits, normal(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _lm_batches(n: int) -> list[Batch]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB, (n, 4, 12), generator=g)
    return [Batch(tgt=t, tgt_mask=torch.ones_like(t, dtype=torch.bool)) for t in ids]


def _settings(tmp_path, **changes) -> TrainSection:
    base = dict(steps=3, lr=3e-3, schedule="constant", warmup=0, log_every=1, device="cpu")
    return TrainSection(out_dir=str(tmp_path), threads=1, **(base | changes))


def test_the_trainer_draws_a_model_built_on_meta_as_a_normal_build(tmp_path):
    config = tiny_config("decoder", positional="rope", tie_embeddings="none")
    torch.manual_seed(0)
    normal = Trainer(build_model(config), _lm_batches(3), train=_settings(tmp_path / "a")).fit()
    meta = Trainer(on_meta(config), _lm_batches(3), train=_settings(tmp_path / "b")).fit()
    assert [r["train_loss"] for r in meta.history] == [r["train_loss"] for r in normal.history]
    for (name, got), (_, want) in zip(
        meta.model.state_dict().items(), normal.model.state_dict().items(), strict=True
    ):
        assert torch.equal(got, want), name


def test_a_run_config_with_init_on_meta_builds_its_model_on_meta_for_the_trainer():
    tokenizer = Tokenizer.train("char", texts=RUN_LINES * 3)
    sections = {"model": {"preset": "llama-tiny"}, "data": {"task": "language-model"}}
    meta = run_model(RunConfig.from_dict({**sections, "train": {"init_on_meta": True}}), tokenizer)
    normal = run_model(RunConfig.from_dict(sections), tokenizer)
    assert is_on_meta(meta) and not is_on_meta(normal)
    assert meta.config == normal.config
    torch.manual_seed(0)  # train.seed, as the Trainer draws it
    materialize(meta, torch.device("cpu"))
    for (name, got), (_, want) in zip(
        meta.state_dict().items(), normal.state_dict().items(), strict=True
    ):
        assert torch.equal(got, want), name


def test_init_on_meta_is_refused_beside_weights_read_from_files():
    with pytest.raises(AttnkitError, match="init_on_meta"):
        TrainSection(init_on_meta=True, init_from="runs/base")


def test_a_7b_model_is_built_and_sharded_from_meta_on_two_ranks_without_its_memory(tmp_path):
    """Llama 2 7B's shape (6.7B weights, 27 GB in float32), sharded over two gloo ranks from
    meta: every rank holds its half of each weight's shape, on meta, and its process never
    came near the model's size; a small model sharded from meta then drawn trains."""
    run_worker([*TORCHRUN, "-m", "tests.train.meta_worker"], tmp_path)
    for rank in (0, 1):
        report = torch.load(tmp_path / f"rank{rank}.pt")
        assert report["parameters"] == 6_738_415_616
        assert report["halves"]  # each weight's first dimension cut in two, on meta
        # 27 GB whole; the process (torch and the interpreter) peaked near 0.34 GB
        assert report["max_rss_bytes"] < 1e9, report["max_rss_bytes"]
        for preset in ("llama-tiny", "gpt-tiny"):
            small = report[preset]
            assert small["small_losses_finite"] and small["ranks_agree"] and small["still_tied"]
