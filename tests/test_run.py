"""The run folder's layout: its file names, metrics, saved data settings and loading with checks."""

import pytest

from attnkit.errors import AttnkitError
from attnkit.run import RunFolder, load_pretrained, load_run, save_pretrained
from tests.helpers import tiny_model, tiny_run


def test_the_layout_names_every_file_of_a_run_folder(tmp_path):
    folder = RunFolder(str(tmp_path))
    names = {
        "config.json": folder.config,
        "model.safetensors": folder.weights,
        "tokenizer.json": folder.tokenizer,
        "run_config.toml": folder.run_config,
        "trainer_state.pt": folder.trainer_state,
        "metrics.jsonl": folder.metrics,
        "curves.png": folder.curves,
        "checkpoints/best/model.safetensors": folder.best_weights,
        "checkpoints/step-0000500/model.safetensors": folder.step_weights(500),
    }
    for name, path in names.items():
        assert path == tmp_path / name
    assert not list(tmp_path.iterdir())  # naming a file creates nothing


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
