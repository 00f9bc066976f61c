"""The Trainer on a GPU: CUDA graphs for batches of one shape, the loss read only when logging."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from attnkit.data import LanguageModelDataset
from attnkit.errors import AttnkitError
from attnkit.train import Trainer
from attnkit.train.compilation import compile_mode
from attnkit.train.run_config import TrainSection
from tests.helpers import VOCAB, tiny_model, translation_batches

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def lm_loader() -> DataLoader:
    stream = np.random.default_rng(0).integers(5, VOCAB, size=2000)
    data = LanguageModelDataset(stream, 16, pad_id=0, windows="random")
    return DataLoader(data, batch_size=8, collate_fn=data.collate, drop_last=True)


def settings(tmp_path, **changes) -> TrainSection:
    base = {"out_dir": str(tmp_path), "steps": 12, "lr": 3e-3, "warmup": 2, "log_every": 4}
    return TrainSection(**{**base, "save_every": 100, **changes})


def test_auto_compile_mode_replays_cuda_graphs_only_for_batches_of_one_shape_on_one_gpu():
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert compile_mode("auto", gpu, one_shape=True, alone=True) == "reduce-overhead"
    assert compile_mode("auto", cpu, one_shape=True, alone=True) == "default"
    # Sentences of many lengths (a graph each), or collectives between the graph's pieces.
    assert compile_mode("auto", gpu, one_shape=False, alone=True) == "default"
    assert compile_mode("auto", gpu, one_shape=True, alone=False) == "default"
    assert compile_mode("max-autotune", cpu, one_shape=False, alone=False) == "max-autotune"
    # What a language model's batches say of themselves, and a list of batches does not.
    assert getattr(lm_loader().dataset, "one_shape", False)
    assert not getattr(translation_batches(2), "dataset", None)


@needs_cuda
def test_a_language_model_trains_on_cuda_graphs_and_reads_its_loss_when_logging(tmp_path):
    options = {"device": "cuda", "compile": True, "precision": "bf16"}
    trainer = Trainer(tiny_model("decoder"), lm_loader(), train=settings(tmp_path, **options))
    result = trainer.fit()
    assert trainer.cuda_graphs and trainer.watch.every == 4
    records = [r for r in result.history if "train_loss" in r]
    assert [r["step"] for r in records] == [4, 8, 12]
    assert records[-1]["train_loss"] < records[0]["train_loss"]


@needs_cuda
def test_a_nan_on_a_gpu_stops_at_the_next_read_and_names_its_step(tmp_path):
    model = tiny_model("decoder")
    trainer = Trainer(model, lm_loader(), train=settings(tmp_path, device="cuda"))
    before = {}

    def poison(info):
        if info["step"] == 2:
            with torch.no_grad():
                model.embed.token.weight[7] = float("nan")
            before.update({k: v.clone() for k, v in model.state_dict().items()})

    trainer.callbacks.append(poison)
    with pytest.raises(AttnkitError, match=r"^the training loss became nan at step 3"):
        trainer.fit()
    assert trainer.step == 4  # read at the first logging step after it
    # No update from the bad step on: the weights are those of step 2 (and the poison).
    for name, value in model.state_dict().items():
        assert torch.equal(value.nan_to_num(), before[name].nan_to_num()), name
