"""The run folder's layout: its file names, metrics, saved data settings and loading with checks."""

import json
import logging
import shutil

import pytest
import torch

from attnkit.errors import AttnkitError
from attnkit.generation import generate
from attnkit.run import RunFolder, load_pretrained, load_run, save_pretrained
from tests.helpers import RUN_LINES, tiny_model, tiny_run


def test_the_layout_names_every_file_of_a_run_folder(tmp_path):
    folder = RunFolder(str(tmp_path))
    names = {
        "config.json": folder.config,
        "model.safetensors": folder.weights,
        "tokenizer.json": folder.tokenizer,
        "tokenizer_fingerprint": folder.fingerprint,
        "run_config.toml": folder.run_config,
        "trainer_state.pt": folder.trainer_state,
        "metrics.jsonl": folder.metrics,
        "curves.png": folder.curves,
        "checkpoints/best/model.safetensors": folder.best_weights,
        "checkpoints/step-0000500/model.safetensors": folder.step_weights(500),
        "tensorboard": folder.tensorboard,
        "wandb": folder.wandb,
    }
    for name, path in names.items():
        assert path == tmp_path / name
    assert not list(tmp_path.iterdir())  # naming a file creates nothing
    # The sinks' folders are the run's own: --overwrite may replace a folder that holds them.
    assert folder.owns(folder.tensorboard) and folder.owns(folder.wandb)
    assert not folder.owns(tmp_path / "notes.txt")


def test_metrics_are_replaced_appended_and_read_back(tmp_path):
    folder = RunFolder(tmp_path)
    assert folder.read_metrics() == []
    folder.write_metrics()
    assert folder.metrics.read_text() == ""
    folder.append_metrics({"step": 1, "train_loss": 2.5})
    folder.append_metrics({"step": 2, "val_loss": 2.0})
    assert folder.read_metrics() == [{"step": 1, "train_loss": 2.5}, {"step": 2, "val_loss": 2.0}]
    folder.write_metrics(folder.read_metrics()[:1])
    assert folder.read_metrics() == [{"step": 1, "train_loss": 2.5}]
    assert not list(tmp_path.glob(".*.tmp"))


def test_saved_steps_are_the_step_folders_that_hold_weights(tmp_path):
    folder = RunFolder(tmp_path)
    assert folder.saved_steps() == []
    for step in (20, 3, 100):
        folder.step_weights(step).parent.mkdir(parents=True)
        folder.step_weights(step).write_bytes(b"")
    folder.step_dir(7).mkdir()  # a step whose weights were never written
    (folder.checkpoints / "step-x").mkdir()
    folder.best_weights.parent.mkdir()
    folder.best_weights.write_bytes(b"")
    assert folder.saved_steps() == [3, 20, 100]


def test_data_defaults_are_the_data_section_of_the_saved_run_config(tmp_path):
    folder = RunFolder(tmp_path)
    assert folder.data_defaults() == {}
    folder.write_run_config('[data]\ncorpus = "multi30k"\nlowercase = true\n\n[train]\nsteps = 3\n')
    assert folder.data_defaults() == {"corpus": "multi30k", "lowercase": True}
    folder.run_config.write_text("[data\n")
    with pytest.raises(AttnkitError, match=r"run_config\.toml is not valid TOML .*; fix"):
        folder.data_defaults()


def test_load_run_gives_the_model_and_tokenizer_or_names_what_is_missing(tmp_path):
    run = load_run(tiny_run(tmp_path / "run", "decoder"))
    assert run.folder.root == tmp_path / "run"
    assert not run.model.training and run.model.config.shape == "decoder"
    assert run.tokenizer.vocab_size == run.model.config.vocab_size
    run.folder.tokenizer.unlink()
    with pytest.raises(AttnkitError, match=r"has no tokenizer\.json; train the run with a"):
        load_run(tmp_path / "run")
    with pytest.raises(AttnkitError, match=r"not an attnkit run folder: config\.json is missing"):
        load_run(tmp_path / "empty")


def test_save_and_load_pretrained_use_the_layout(tmp_path):
    model = tiny_model("decoder")
    folder = RunFolder(save_pretrained(model, tmp_path))
    assert folder.config.is_file() and folder.weights.is_file()
    assert load_pretrained(folder.root).config == model.config


@pytest.mark.parametrize("saved", ["null", "absent"])
@pytest.mark.parametrize("shape", ["encoder-decoder", "decoder"])
def test_a_run_saved_without_decoding_ids_decodes_as_a_new_one(tmp_path, caplog, shape, saved):
    """Runs saved before models recorded `eos_id` and `decoder_start_id` take them from their
    tokenizer, so `generate` starts and stops as on a run that records them."""
    new = tiny_run(tmp_path / "new", shape)
    old = shutil.copytree(new, tmp_path / "old")
    config = json.loads(RunFolder(old).config.read_text())
    for name in ("eos_id", "decoder_start_id"):
        if saved == "null":
            config[name] = None
        else:
            del config[name]
    RunFolder(old).config.write_text(json.dumps(config))
    with caplog.at_level(logging.INFO, logger="attnkit.run"):
        old_run = load_run(old)
    taken = [r.getMessage() for r in caplog.records if "from its tokenizer" in r.getMessage()]
    assert len(taken) == 1 and f"eos_id {old_run.tokenizer.eos_id} from" in taken[0]
    new_run = load_run(new)
    assert old_run.model.config == new_run.model.config
    assert new_run.model.config.eos_id == new_run.tokenizer.eos_id
    ids = torch.tensor(new_run.tokenizer.encode_batch(RUN_LINES, padding=True))
    mask = ids != new_run.tokenizer.pad_id
    before, now = (generate(run.model, ids, mask, max_new_tokens=12) for run in (old_run, new_run))
    assert torch.equal(before.sequences, now.sequences)
    assert before.eos_token_ids == now.eos_token_ids == (new_run.tokenizer.eos_id,)
