"""train.log_to: the records of metrics.jsonl, read back from TensorBoard's event files and from
an offline W&B run's transaction log, equal those of metrics.jsonl."""

import dataclasses
import json
import struct
import sys
import zlib
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from wandb.proto import wandb_internal_pb2

from attnkit.data.batch import Batch, pad
from attnkit.errors import AttnkitError
from attnkit.run import RunFolder
from attnkit.train import Trainer
from attnkit.train.loggers import LogContext, check_installed, open_for
from attnkit.train.run_config import EvalSection, RunConfig, TrainSection
from attnkit.train.validate import validate
from tests.helpers import VOCAB, tiny_model, translation_batches


@pytest.fixture(autouse=True)
def offline_wandb(tmp_path, monkeypatch):
    """W&B offline, its settings and caches in the test's folder, and no server within reach."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    for name in ("WANDB_DIR", "WANDB_PROJECT", "WANDB_NAME", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(name, raising=False)


def trainer(run: Path, log_to, shape="encoder-decoder", data=None, callbacks=(), **changes):
    settings = {"steps": 6, "warmup": 2, "log_every": 2, "save_every": 3, "threads": 1}
    train = TrainSection(out_dir=str(run), log_to=log_to, **{**settings, **changes})
    data = data or translation_batches(5)
    model = tiny_model(shape, dropout=0.1)
    val = data[:2] if shape != "encoder-decoder" else translation_batches(2, seed=9)
    return Trainer(
        model, data, train=train, eval=EvalSection(every=3), val_data=val, callbacks=callbacks
    )


def scalars_of(folder: RunFolder) -> dict[tuple[int, str], float]:
    """Every number of metrics.jsonl by (step, name)."""
    records = folder.read_metrics()
    return {(r["step"], k): v for r in records for k, v in r.items() if k != "step"}


def tensorboard_events(logdir: Path) -> EventAccumulator:
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    return events.Reload()


def test_tensorboard_event_files_hold_every_record_the_config_and_the_pictures(tmp_path):
    run = tmp_path / "run"
    trainer(run, ("tensorboard",)).fit()
    expected = scalars_of(RunFolder(run))
    assert {"train_loss", "lr", "tokens_per_s", "val_loss", "val_ppl", "minutes"} == {
        name for _, name in expected
    }
    events = tensorboard_events(run / "tensorboard")
    logged = {
        (e.step, tag): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)
    }
    assert logged == pytest.approx(expected, rel=1e-6)  # event files hold float32
    for tag in ("curves", "attention"):  # at each evaluation
        pictures = events.Images(tag)
        assert [p.step for p in pictures] == [3, 6]
        assert all(p.width > 100 and p.height > 100 for p in pictures)
    hparams = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(
        hparams["_hparams_/session_start_info"]
    ).session_start_info.hparams
    assert start["train.lr"].number_value == pytest.approx(1e-3)
    assert start["train.log_to"].string_value == "('tensorboard',)"
    assert start["model.d_model"].number_value == 16


def test_a_resumed_run_goes_on_in_the_same_tensorboard_folder(tmp_path):
    """A crash at step 5 leaves a record of step 4 after the checkpoint of step 3; the resumed
    session logs step 4 again, and TensorBoard shows its value alone, as metrics.jsonl does."""
    run = tmp_path / "run"

    def crash(info):
        if info["step"] == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        trainer(run, ("tensorboard",), callbacks=[crash], steps=8).fit()
    stale = scalars_of(RunFolder(run))[(4, "train_loss")]
    trainer(run, ("tensorboard",), steps=8).fit(resume=True)
    expected = scalars_of(RunFolder(run))
    assert expected[(4, "train_loss")] != pytest.approx(stale)
    events = tensorboard_events(run / "tensorboard")
    losses = {e.step: e.value for e in events.Scalars("train_loss")}
    assert [e.step for e in events.Scalars("train_loss")] == [2, 4, 6, 8]
    assert losses == pytest.approx({s: expected[(s, "train_loss")] for s in (2, 4, 6, 8)})


@pytest.mark.parametrize(
    ("shape", "batch"),
    [
        ("decoder", lambda ids, mask: Batch(tgt=ids, tgt_mask=mask)),
        ("encoder", lambda ids, mask: Batch(src=ids, src_mask=mask)),
    ],
)
def test_each_model_shape_draws_its_attention_at_evaluation(tmp_path, shape, batch):
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(5, VOCAB, (n,), generator=g).tolist() for n in (9, 6, 7, 8)]
    data = [batch(*pad(rows, 0))] * 3
    trainer(tmp_path / "run", ("tensorboard",), shape, data, steps=3).fit()
    events = tensorboard_events(tmp_path / "run" / "tensorboard")
    assert [p.step for p in events.Images("attention")] == [3]


def test_the_sinks_need_no_trainer_only_a_context(tmp_path):
    """A `LogContext` alone opens the sinks: what a session tells them, not the Trainer."""
    model = tiny_model("encoder-decoder")
    context = LogContext(
        RunFolder(tmp_path / "run"), ("tensorboard",), "attnkit", "run",
        {"train": {"lr": 0.5}}, "bleu", 0, model, examples=translation_batches(1),
    )  # fmt: skip
    history = [{"step": 1, "train_loss": 3.0}, {"step": 2, "train_loss": 2.5}]
    with open_for(context) as sinks:
        for record in history:
            sinks.record(record)
        sinks.evaluated(2, history)
    events = tensorboard_events(tmp_path / "run" / "tensorboard")
    assert [(e.step, e.value) for e in events.Scalars("train_loss")] == [(1, 3.0), (2, 2.5)]
    assert [p.step for p in events.Images("curves")] == [2]
    assert [p.step for p in events.Images("attention")] == [2]
    assert not open_for(dataclasses.replace(context, is_main=False)).writer  # rank 0 logs


def test_pictures_change_nothing_in_training(tmp_path):
    """The attention is drawn in eval mode on a forked generator: with dropout drawing random
    numbers, a run that logs ends with the very weights of one that does not."""
    plain = trainer(tmp_path / "plain", ()).fit().model.state_dict()
    logged = trainer(tmp_path / "logged", ("tensorboard",)).fit().model.state_dict()
    assert all(torch.equal(plain[k], logged[k]) for k in plain)


def wandb_records(run_folder: Path):
    """The records of an offline W&B run's transaction log, `run-ID.wandb`: wandb's own protobuf
    `Record`s in LevelDB's log format (32 KiB blocks of checksummed, length-prefixed chunks,
    after a 7-byte header), which wandb writes and reads back in its Go core only."""
    [path] = run_folder.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:7] == struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
    position, pieces = 7, b""
    while position + 7 <= len(data):
        if (left := 32768 - position % 32768) < 7:  # a block's tail too short for a header
            position += left
            continue
        checksum, length, kind = struct.unpack("<IHB", data[position : position + 7])
        chunk = data[position + 7 : position + 7 + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == checksum
        position, pieces = position + 7 + length, pieces + chunk
        if kind in (1, 4):  # a full record, or the last chunk of one
            yield wandb_internal_pb2.Record.FromString(pieces)
            pieces = b""


def wandb_history(run_folder: Path) -> tuple[dict[int, dict], wandb_internal_pb2.RunRecord, dict]:
    """The rows the run logged, by step, its run record (id, name, project), and its config."""
    rows, run, config = {}, None, {}
    for record in wandb_records(run_folder):
        if record.HasField("history"):
            items = record.history.item
            row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in items}
            rows[row["_step"]] = row
        elif record.HasField("run"):
            run = record.run
        elif record.HasField("config"):
            config.update({u.key: json.loads(u.value_json) for u in record.config.update})
    return rows, run, config


def test_an_offline_wandb_run_holds_every_record_and_a_resume_continues_it(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE")  # offline is the default; no server is within reach anyway
    run = tmp_path / "my-run"
    first = trainer(
        run, ("wandb",), callbacks=[lambda info: info["step"] == 3 and first.request_stop()]
    )
    first.fit()
    trainer(run, ("wandb",)).fit(resume=True)
    folders = sorted((run / "wandb").glob("offline-run-*"))
    assert len(folders) == 2  # one a session
    expected = scalars_of(RunFolder(run))
    logged, ids = {}, set()
    for folder in folders:
        rows, record, config = wandb_history(folder)
        logged.update({(s, k): v for s, row in rows.items() for k, v in row.items()})
        ids.add(record.run_id)
        assert (record.project, record.display_name) == ("attnkit", "my-run")
        assert config["train"]["out_dir"] == str(run) and config["model"]["d_model"] == 16
    assert len(ids) == 1  # the resumed session continues the same run
    assert {key: logged[key] for key in expected} == expected  # the very floats
    for step in (3, 6):
        picture = folders[-1 if step == 6 else 0] / "files" / logged[(step, "attention/path")]
        assert picture.is_file() and logged[(step, "curves/_type")] == "image-file"


def test_wandb_mode_from_the_environment_and_the_names_from_the_config(tmp_path):
    trainer(tmp_path / "run", ("wandb",), log_project="mt", log_name="first try", steps=2).fit()
    [folder] = (tmp_path / "run" / "wandb").glob("offline-run-*")
    rows, record, _ = wandb_history(folder)
    assert (record.project, record.display_name) == ("mt", "first try")
    assert rows[2]["train_loss"] == RunFolder(tmp_path / "run").read_metrics()[0]["train_loss"]


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_a_sink_whose_package_is_missing_stops_before_training(tmp_path, monkeypatch, name):
    # A None in sys.modules makes the import fail as for a package that is not installed.
    for module in (name, "torch.utils.tensorboard", "wandb"):
        monkeypatch.setitem(sys.modules, module, None)
    sentence = f"the {name} package is not installed; install it with pip install 'attnkit[{name}]'"
    with pytest.raises(AttnkitError, match=sentence.replace("[", r"\[").replace("]", r"\]")):
        check_installed([name])
    config = RunConfig.from_dict(
        {"data": {"task": "reverse"}, "train": {"log_to": [name], "out_dir": str(tmp_path / "r")}}
    )
    with pytest.raises(AttnkitError, match="not installed"):
        validate(config)
    with pytest.raises(AttnkitError, match="not installed"):
        trainer(tmp_path / "run", (name,)).fit()
    assert not (tmp_path / "run" / "trainer_state.pt").exists()


def test_log_to_is_checked_and_written_back():
    with pytest.raises(AttnkitError, match=r"train\.log_to has no sink 'tensorbord'; did you mean"):
        TrainSection(log_to=("tensorbord",))
    with pytest.raises(AttnkitError, match=r"train\.log_to must be a list of strings"):
        RunConfig.from_dict({"train": {"log_to": "wandb"}})
    config = RunConfig.from_dict({"train": {"log_to": ["tensorboard", "wandb"]}})
    assert config.train.log_to == ("tensorboard", "wandb")
    assert 'log_to = ["tensorboard", "wandb"]' in config.to_toml()
    word2vec = {"data": {"task": "word2vec", "corpus": "x"}, "train": {"log_to": ["wandb"]}}
    with pytest.raises(AttnkitError, match="a word2vec run trains without it"):
        validate(RunConfig.from_dict(word2vec))
