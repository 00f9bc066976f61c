"""Faults and surprises in training, each case named: a resume under changed settings, two
trainings on one run folder, SIGTERM, a NaN before the first checkpoint, the resume hint."""

import dataclasses
import json
import logging
import os
import signal
import socket

import pytest
import torch

from attnkit.cli import main
from attnkit.errors import AttnkitError
from attnkit.run import RunFolder
from attnkit.train import Trainer, tasks
from attnkit.train import checkpoint as ckpt
from attnkit.train.lock import hold
from attnkit.train.optim import schedule_factor
from attnkit.train.run_config import EvalSection, RunConfig, TrainSection
from bench.fault_injection import CONFIG
from tests.helpers import cut_safetensors_save, tiny_model, translation_batches, translation_config

# Two steps at a constant rate, a checkpoint at the end.
TWO_STEPS = TrainSection(steps=2, lr=3e-3, schedule="constant", warmup=0, save_every=2, threads=1)


def section(tmp_path, **changes) -> TrainSection:
    return dataclasses.replace(TWO_STEPS, out_dir=str(tmp_path), log_every=1, **changes)


def trained(tmp_path, **changes) -> Trainer:
    trainer = Trainer(tiny_model(), translation_batches(3), train=section(tmp_path, **changes))
    trainer.fit()
    return trainer


def changed_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "changed settings" in r.getMessage()]


# -- a resume under changed settings --------------------------------------------------------------


def test_resume_applies_a_changed_learning_rate_weight_decay_betas_and_eps(tmp_path, caplog):
    trained(tmp_path)
    changes = {"lr": 5e-4, "weight_decay": 0.1, "beta1": 0.8, "beta2": 0.95, "eps": 1e-6}
    trainer = Trainer(
        tiny_model(), translation_batches(3), train=section(tmp_path, steps=4, **changes)
    )
    rates: list[float] = []
    trainer.callbacks.append(lambda info: rates.append(info["lr"]))
    with caplog.at_level(logging.INFO, logger="attnkit.train"):
        trainer.fit(resume=True)
    assert rates == [5e-4, 5e-4]
    decayed, exempt = trainer.optimizer.param_groups
    assert (decayed["weight_decay"], exempt["weight_decay"]) == (0.1, 0.0)
    for group in (decayed, exempt):
        assert (group["lr"], tuple(group["betas"]), group["eps"]) == (5e-4, (0.8, 0.95), 1e-6)
    # Adam's moments went on: four steps counted, not two.
    first = decayed["params"][0]
    assert int(trainer.optimizer.state[first]["step"]) == 4
    assert ckpt.load_trainer_state(RunFolder(tmp_path))["settings"]["train.lr"] == 5e-4
    (line,) = changed_lines(caplog)
    for change in ("train.lr 0.003 -> 0.0005", "train.weight_decay 0.01 -> 0.1"):
        assert change in line
    assert "train.beta1 0.9 -> 0.8" in line and "train.steps 2 -> 4" in line


def test_resume_applies_a_changed_schedule_from_the_very_next_step(tmp_path):
    """A longer warmup: the rate of step 3 (the first one resumed) is already the new one's."""
    trained(tmp_path, warmup=4)
    trainer = Trainer(tiny_model(), [], train=section(tmp_path, warmup=8))
    trainer.fit(resume=True)  # at step 2 of 2: nothing to run, the next rate is set
    factor = schedule_factor("constant", lr=3e-3, warmup=8, steps=2)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(3e-3 * factor(3))
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(3e-3 * 3 / 8)


def test_resume_with_nothing_changed_logs_no_change(tmp_path, caplog):
    trained(tmp_path)
    with caplog.at_level(logging.INFO, logger="attnkit.train"):
        Trainer(tiny_model(), translation_batches(3), train=section(tmp_path)).fit(resume=True)
    assert not changed_lines(caplog)


def test_resume_refuses_a_changed_seed_in_one_sentence(tmp_path):
    trained(tmp_path)
    with pytest.raises(AttnkitError) as err:
        Trainer(tiny_model(), [], train=section(tmp_path, seed=7)).fit(resume=True)
    message = str(err.value)
    assert message.startswith("train.seed cannot change when a run resumes")
    assert "set train.seed = 0 again or start a new train.out_dir" in message
    assert "\n" not in message


def test_resume_of_a_run_saved_before_settings_were_recorded_applies_a_new_rate(tmp_path, caplog):
    trained(tmp_path)
    state = ckpt.load_trainer_state(RunFolder(tmp_path))
    del state["settings"]
    torch.save(state, RunFolder(tmp_path).trainer_state)
    trainer = Trainer(tiny_model(), translation_batches(3), train=section(tmp_path, lr=5e-4))
    with caplog.at_level(logging.INFO, logger="attnkit.train"):
        trainer.fit(resume=True)
    assert trainer.optimizer.param_groups[0]["lr"] == 5e-4
    (line,) = changed_lines(caplog)
    assert line.endswith("with changed settings: train.lr 0.003 -> 0.0005")


def test_resume_with_another_eval_metric_forgets_the_best_of_the_old_one(tmp_path):
    """A best BLEU of 30 must not make a later chrF of 25 look worse."""
    scores = [{"bleu": 30.0, "chrf": 40.0}, {"bleu": 20.0, "chrf": 25.0}]
    Trainer(
        tiny_model(),
        translation_batches(3),
        train=section(tmp_path),
        eval=EvalSection(every=2, metric="bleu"),
        metrics=[lambda model: scores[0]],
    ).fit()
    assert ckpt.load_trainer_state(RunFolder(tmp_path))["best"] == 30.0
    result = Trainer(
        tiny_model(),
        translation_batches(3),
        train=section(tmp_path, steps=4),
        eval=EvalSection(every=2, metric="chrf"),
        metrics=[lambda model: scores[1]],
    ).fit(resume=True)
    assert result.best == 25.0


def test_resume_records_the_changed_settings_in_run_config_toml(tmp_path):
    first = RunConfig(train=section(tmp_path))
    Trainer(tiny_model(), translation_batches(3), train=first.train, run_config=first).fit()
    again = RunConfig(train=section(tmp_path, lr=5e-4, steps=3))
    Trainer(tiny_model(), translation_batches(3), train=again.train, run_config=again).fit(
        resume=True
    )
    recorded = RunConfig.load(RunFolder(tmp_path).run_config)
    assert (recorded.train.lr, recorded.train.steps) == (5e-4, 3)


def test_readme_example_set_lr_with_resume(tmp_path, caplog):
    """`attnkit train CFG --set train.lr=5e-4 --resume` trains on at the new rate."""
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    run = tmp_path / "run"
    options = ["--set", f"train.out_dir={run}", "--set", "train.steps=2"]
    assert main(["train", str(config), *options]) == 0
    with caplog.at_level(logging.INFO, logger="attnkit.train"):
        resumed = ["--set", "train.steps=3", "--set", "train.lr=5e-4", "--resume"]
        assert main(["train", str(config), *options, *resumed]) == 0
    state = ckpt.load_trainer_state(RunFolder(run))
    assert state["step"] == 3 and state["optimizer"]["param_groups"][0]["lr"] == 5e-4
    assert RunConfig.load(RunFolder(run).run_config).train.lr == 5e-4
    (line,) = changed_lines(caplog)
    assert "train.lr 0.001 -> 0.0005" in line


# -- two trainings on one run folder --------------------------------------------------------------


def test_a_second_training_on_a_run_folder_is_refused_naming_the_pid(tmp_path):
    # The first training's lock, held by this process.
    with hold(RunFolder(tmp_path)), pytest.raises(AttnkitError) as err:
        Trainer(tiny_model(), translation_batches(3), train=section(tmp_path)).fit()
    message = str(err.value)
    assert message.startswith(f"another training (pid {os.getpid()} on {socket.gethostname()})")
    assert "wait for it to finish, stop it, or choose another train.out_dir" in message
    assert not RunFolder(tmp_path).trainer_state.exists()


def test_a_second_training_through_the_cli_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    """Refused before any work: no tokenizer is trained, no data read."""
    monkeypatch.setattr(tasks, "build_task", lambda config: pytest.fail("the task was built"))
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    run = tmp_path / "run"
    with hold(RunFolder(run)):
        options = ["--set", f"train.out_dir={run}", "--set", "train.steps=2"]
        assert main(["train", str(config), *options]) == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert error.startswith(f"attnkit: error: another training (pid {os.getpid()} on ")


def test_a_stale_lock_of_a_killed_training_is_taken_over_with_a_log_line(tmp_path, caplog):
    """What kill -9 leaves: the lock file naming its holder, with no one holding the lock."""
    folder = RunFolder(tmp_path)
    folder.lock.write_text(json.dumps({"pid": 999999, "host": "gpu-node-7"}))
    with caplog.at_level(logging.WARNING, logger="attnkit.train"):
        trained(tmp_path)
    (line,) = [r.getMessage() for r in caplog.records if "took over the lock" in r.getMessage()]
    assert "pid 999999 on gpu-node-7" in line
    assert not folder.lock.exists()


def test_the_lock_is_held_while_training_and_released_after_an_end_an_error_and_a_stop(tmp_path):
    folder = RunFolder(tmp_path)
    held: list[bool] = []
    trainer = Trainer(tiny_model(), translation_batches(3), train=section(tmp_path))
    trainer.callbacks.append(lambda info: held.append(folder.lock.exists()))
    trainer.fit()
    assert held == [True, True] and not folder.lock.exists()
    with pytest.raises(AttnkitError, match="already holds a run"):
        trained(tmp_path)
    assert not folder.lock.exists()
    trainer = Trainer(tiny_model(), translation_batches(3), train=section(tmp_path, steps=6))
    trainer.callbacks.append(lambda info: trainer.request_stop())
    assert trainer.fit(resume=True).stopped == "interrupted"
    assert not folder.lock.exists()
    with hold(folder):  # and it can be taken again
        assert folder.lock.exists()


def test_temporary_files_of_saves_cut_short_by_a_kill_are_removed_on_resume(tmp_path, caplog):
    """kill -9 mid-save leaves .NAME.XXXXXXXX.tmp files, each as large as the model, and
    under a weights file's the .tmpXXXXXX that safetensors stages its own save in."""
    trained(tmp_path)
    folder = RunFolder(tmp_path)
    cut = [
        folder.root / ".model.safetensors.k2j4x9q1.tmp",
        folder.step_dir(2) / ".model.safetensors.z_80ab1c.tmp",
    ]
    for path in cut:
        path.write_bytes(b"half a model")
    cut += [cut_safetensors_save(folder.root / ".tmp0IQnAE")]
    cut += [cut_safetensors_save(folder.step_dir(2) / ".tmpBFGXe6")]
    with caplog.at_level(logging.INFO, logger="attnkit.train"):
        Trainer(tiny_model(), translation_batches(3), train=section(tmp_path)).fit(resume=True)
    assert not any(path.exists() for path in cut)
    assert "removed 4 temporary files of saves cut short" in caplog.text


# -- SIGTERM and the resume hint ------------------------------------------------------------------


def test_sigterm_finishes_the_step_saves_and_stops(tmp_path):
    previous = signal.getsignal(signal.SIGTERM)
    trainer = Trainer(tiny_model(), translation_batches(3), train=section(tmp_path, steps=8))
    trainer.callbacks.append(
        lambda info: info["step"] == 2 and os.kill(os.getpid(), signal.SIGTERM)
    )
    result = trainer.fit()
    assert (result.stopped, result.step) == ("terminated", 2)
    assert ckpt.load_trainer_state(RunFolder(tmp_path))["step"] == 2
    assert signal.getsignal(signal.SIGTERM) is previous
    assert not RunFolder(tmp_path).lock.exists()


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_through_the_cli_saves_exits_128_plus_it_and_repeats_the_set_options(
    tmp_path, monkeypatch, capsys, signum, status
):
    """The hint to continue names the options the run was started with."""
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    save = ckpt.save_checkpoint

    def save_then_signal(run_dir, model, state, keep_last):
        path = save(run_dir, model, state, keep_last)
        if state["step"] == 1:
            os.kill(os.getpid(), signum)
        return path

    monkeypatch.setattr(ckpt, "save_checkpoint", save_then_signal)
    run = tmp_path / "run"
    options = ["--set", f"train.out_dir={run}", "--set", "train.lr=5e-4"]
    assert main(["train", str(config), *options]) == status
    out = capsys.readouterr().out
    assert f"stopped at step 2 and saved; continue with: attnkit train {config} " in out
    assert out.rstrip().endswith(f"--set train.out_dir={run} --set train.lr=5e-4 --resume")
    assert ckpt.load_trainer_state(RunFolder(run))["step"] == 2


# -- a NaN loss -----------------------------------------------------------------------------------


def test_a_nan_loss_before_the_first_checkpoint_says_none_was_saved(tmp_path):
    model = tiny_model()
    trainer = Trainer(model, translation_batches(3), train=section(tmp_path, steps=8))

    def poison(info):
        with torch.no_grad():
            model.tgt_embed.token.weight[7] = float("nan")

    trainer.callbacks.append(poison)
    with pytest.raises(AttnkitError) as err:
        trainer.fit()
    message = str(err.value)
    assert message.startswith("the training loss became nan at step 2")
    assert f"no checkpoint was saved yet in {tmp_path}" in message and "then start again" in message
    assert "intact" not in message


# -- silent where a warning belongs (issue 39, POOR) ---------------------------------------------


@pytest.mark.parametrize(("warmup", "said"), [(5, True), (2, False)])
def test_a_warmup_longer_than_the_run_is_said(tmp_path, caplog, warmup, said):
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        trained(tmp_path, warmup=warmup)
    message = "train.warmup 5 is longer than the run (train.steps 2): the rate rises to 0.0012 at"
    assert (message in caplog.text) == said


def test_resume_lists_changed_data_settings_and_keeps_the_runs_vocabulary(tmp_path, caplog):
    """[data] changes were applied but left out of the "changed settings" line, and a changed
    data.tokenizer was recorded though the run went on with its own (issue 39, POOR)."""
    config = translation_config(tmp_path)
    assert main(["train", config, "--set", "train.steps=2"]) == 0
    changes = ["data.tokenizer=bpe", "data.vocab_size=90", "data.max_tokens=300", "train.steps=4"]
    sets = [arg for change in changes for arg in ("--set", change)]
    with caplog.at_level(logging.INFO, logger="attnkit"):
        assert main(["train", config, "--resume", *sets]) == 0
    assert (
        "data.tokenizer 'bpe' (the run's is 'char'), data.vocab_size 90 (the run's is 100) not "
        "applied: a resumed run goes on with the tokenizer its model was trained with"
    ) in caplog.text
    (line,) = changed_lines(caplog)
    assert "data.max_tokens 200 -> 300" in line and "train.steps 2 -> 4" in line
    assert "data.tokenizer" not in line
    recorded = RunConfig.load(tmp_path / "run" / "run_config.toml").data
    assert (recorded.tokenizer, recorded.vocab_size, recorded.max_tokens) == ("char", 100, 300)
