"""Files, weights, tokenizers and interop under bad input: folders that attnkit did not make
are never overwritten or deleted, a full disk is one sentence that names what is intact,
damaged weights and a wrong device are named as such, a tokenizer of another model is
refused, and saved files respect the umask. (Hugging Face folders that are not what they
seem: tests/interop/test_interop_bad_folders.py.)"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from attnkit import AttnkitError
from attnkit.cli import main
from attnkit.data.reverse import tokenizer as reverse_tokenizer
from attnkit.demo import demo_run_config, run_demo
from attnkit.files import WriteError, atomic_write, replace_folder
from attnkit.interop import export_hf, import_hf, load_hf
from attnkit.run import FINGERPRINT_KEY, RunFolder, load_pretrained, load_run, save_pretrained
from attnkit.tokenizer import Tokenizer
from attnkit.train.checkpoint import save_checkpoint
from tests.helpers import RUN_LINES, rewrite_weights, tiny_model, tiny_run, translation_config

NO_SPACE = os.strerror(errno.ENOSPC)


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, NO_SPACE)


def contents(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative name -> bytes): what a refusal must leave as it was."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture
def trained_run(hf_folder: Path, tmp_path: Path) -> Path:
    """A run folder as training leaves it: weights, tokenizer, trainer state, run config (a
    GPT-2 model, so that it exports)."""
    run = tmp_path / "run"
    import_hf(hf_folder, run)
    (run / "trainer_state.pt").write_bytes(b"state of step 500")
    (run / "run_config.toml").write_text('[data]\ntask = "language-model"\n')
    return run


# -- folders attnkit did not make (must 2) ---------------------------------------------------


def test_import_into_a_run_folder_that_is_not_empty_is_refused(hf_folder, trained_run):
    before = contents(trained_run)
    with pytest.raises(AttnkitError, match=r"run is not empty; choose a new folder, or pass --ov"):
        import_hf(hf_folder, trained_run)
    assert contents(trained_run) == before


def test_import_with_overwrite_replaces_the_run_folder_leaving_nothing_stale(
    hf_folder, trained_run
):
    (hf_folder / "tokenizer.json").unlink()
    import_hf(hf_folder, trained_run, overwrite=True)
    # Nothing of the old run is left to go with the new weights: no trainer state, no tokenizer.
    assert sorted(p.name for p in trained_run.iterdir()) == ["config.json", "model.safetensors"]
    assert load_hf(hf_folder).model.config == load_pretrained(trained_run).config


def test_overwrite_never_replaces_a_folder_that_holds_no_model(hf_folder, trained_run, tmp_path):
    notes = tmp_path / "notes"
    (notes / "checkpoints").mkdir(parents=True)  # a name attnkit writes, but no model
    (notes / "checkpoints" / "thesis.tex").write_text("months of work")
    with pytest.raises(AttnkitError, match=r"holds files but no model \(config.json\), so attnkit"):
        import_hf(hf_folder, notes, overwrite=True)
    with pytest.raises(AttnkitError, match="holds files but no model"):
        export_hf(trained_run, notes, overwrite=True)
    assert (notes / "checkpoints" / "thesis.tex").read_text() == "months of work"


def test_export_into_a_folder_that_is_not_empty_is_refused_and_overwrite_replaces_it(
    trained_run, hf_folder, capsys
):
    before = contents(hf_folder)
    assert main(["export", "hf", str(trained_run), str(hf_folder)]) == 2
    assert "hf is not empty; choose a new folder, or pass --overwrite" in capsys.readouterr().err
    assert contents(hf_folder) == before
    (hf_folder / "tokenizer_fingerprint").write_text("of an earlier import")
    assert main(["export", "hf", str(trained_run), str(hf_folder), "--overwrite"]) == 0
    names = sorted(p.name for p in hf_folder.iterdir())
    assert names == ["config.json", "model.safetensors", "tokenizer.json"]


def test_a_folder_is_not_written_over_the_folder_it_is_read_from(trained_run, hf_folder):
    with pytest.raises(AttnkitError, match="the folder the model is read from; write it elsewhere"):
        export_hf(trained_run, trained_run, overwrite=True)
    with pytest.raises(AttnkitError, match="the folder the model is read from"):
        import_hf(hf_folder, hf_folder.parent, overwrite=True)
    assert (trained_run / "trainer_state.pt").is_file()


def test_a_failed_write_leaves_the_folder_as_it_was(trained_run):
    before = contents(trained_run)

    def half(stage: Path) -> None:
        (stage / "config.json").write_text("{}")
        raise AttnkitError("stopped half-way")

    with pytest.raises(AttnkitError, match="stopped half-way"):
        replace_folder(trained_run, half)
    assert contents(trained_run) == before
    with pytest.raises(AttnkitError, match="stopped half-way"):
        replace_folder(trained_run.parent / "new", half)
    assert not (trained_run.parent / "new").exists()


def test_the_demo_refuses_to_delete_a_run_folder_it_did_not_make(trained_run, capsys):
    """`attnkit demo --out X` puts its run in X/run, where `train.out_dir` defaults go."""
    before = contents(trained_run)
    assert main(["demo", "--out", str(trained_run.parent), "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "run holds files that are not a run of the demo, and the demo starts afresh" in err
    assert contents(trained_run) == before


def test_the_demo_replaces_a_run_of_its_own(tmp_path):
    config = demo_run_config(
        **{"train.out_dir": str(tmp_path / "run"), "train.steps": 2, "eval.every": 100}
    )
    run_demo(config, tmp_path / "attention.png", eval_examples=4)
    (tmp_path / "run" / "checkpoints" / "step-0000999").mkdir()  # a leftover of the last run
    run_demo(config, tmp_path / "attention.png", eval_examples=4)
    assert RunFolder(tmp_path / "run").saved_steps() == [2]
    assert not (tmp_path / "run" / "checkpoints" / "step-0000999").exists()


# -- a full disk (must 5) --------------------------------------------------------------------


def test_a_full_disk_names_the_file_and_keeps_the_previous_version(tmp_path):
    path = atomic_write(tmp_path / "config.json", lambda p: p.write_text("old"))
    with pytest.raises(WriteError) as info:
        atomic_write(path, full_disk)
    assert str(info.value) == (
        f"could not write {path} (No space left on device); its previous version is intact"
    )
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no temporary file left


@pytest.mark.parametrize("raised", ["torch", "safetensors"])
def test_a_full_disk_is_recognised_in_the_errors_of_torch_and_safetensors(tmp_path, raised):
    def write(p: Path) -> None:
        if raised == "safetensors":  # its Rust writer names the error number
            raise RuntimeError("Error while serializing: I/O error: (os error 28)")
        try:
            full_disk()
        except OSError:
            # As torch's zip writer raises it: the OSError is only the context of its error.
            raise RuntimeError("[enforce fail at inline_container.cc:672] . pos")  # noqa: B904

    with pytest.raises(WriteError, match=r"\(No space left on device\); no partial file was left"):
        atomic_write(tmp_path / "trainer_state.pt", write)


def test_a_checkpoint_on_a_full_disk_names_the_checkpoint_that_is_intact(tmp_path, monkeypatch):
    model = tiny_model("decoder")
    save_checkpoint(RunFolder(tmp_path), model, {"step": 100}, keep_last=2)
    before = contents(tmp_path)
    monkeypatch.setattr("attnkit.train.checkpoint.save_model", full_disk)
    with pytest.raises(WriteError) as info:
        save_checkpoint(RunFolder(tmp_path), model, {"step": 200}, keep_last=2)
    step_dir = tmp_path / "checkpoints" / "step-0000100"
    assert str(info.value) == (
        f"could not write {tmp_path}/checkpoints/step-0000200/model.safetensors (No space left "
        f"on device); the checkpoint of step 100 ({step_dir}) is intact: free some space, then "
        "continue with --resume"
    )
    assert contents(tmp_path) == before


def test_a_full_disk_at_the_first_checkpoint_says_there_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr("attnkit.train.checkpoint.save_model", full_disk)
    with pytest.raises(WriteError, match="no checkpoint had been saved yet; free some space"):
        save_checkpoint(RunFolder(tmp_path), tiny_model("decoder"), {"step": 100}, keep_last=2)


def test_a_full_disk_while_logging_metrics_leaves_no_half_line(tmp_path, monkeypatch):
    folder = RunFolder(tmp_path)
    folder.append_metrics({"step": 1, "train_loss": 2.5})
    folder.step_weights(50).parent.mkdir(parents=True)
    folder.step_weights(50).write_bytes(b"")
    real_write, calls = os.write, []

    def half_then_full(fd: int, data) -> int:
        calls.append(fd)
        if len(calls) > 1:
            full_disk()
        return real_write(fd, bytes(data[:5]))  # the first write goes half-way

    with monkeypatch.context() as m:
        m.setattr(os, "write", half_then_full)
        with pytest.raises(WriteError, match=r"the checkpoint of step 50 \(.*\) is intact"):
            folder.append_metrics({"step": 2, "train_loss": 2.0})
    assert folder.read_metrics() == [{"step": 1, "train_loss": 2.5}]


def test_a_real_file_size_limit_ends_in_one_sentence(tmp_path):
    """The operating system's own refusal (ulimit -f: "File too large") through safetensors."""
    run = tiny_run(tmp_path / "run", "decoder")
    script = (
        "import resource, signal, sys\n"
        "from attnkit.run import load_pretrained, save_pretrained\n"
        "from attnkit.errors import AttnkitError\n"
        f"model = load_pretrained({str(run)!r})\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "try:\n"
        f"    save_pretrained(model, {str(run)!r})\n"
        "except AttnkitError as err:\n"
        "    print(err)\n"
    )
    before = (run / "model.safetensors").read_bytes()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == (
        f"could not write {run}/model.safetensors (File too large); its previous version is intact"
    ), done.stderr
    assert (run / "model.safetensors").read_bytes() == before


# -- damaged weights and a wrong device (must 6) ---------------------------------------------


@pytest.mark.parametrize("value, what", [(float("nan"), "NaN"), (float("inf"), "infinite")])
def test_weights_holding_nan_or_inf_are_named_as_damaged(tmp_path, value, what):
    run = tiny_run(tmp_path / "run", "decoder")
    name = "decoder.blocks.0.ff.w_1.weight"

    rewrite_weights(run, lambda tensors: tensors[name][3].fill_(value))
    with pytest.raises(AttnkitError) as info:
        load_run(run)
    assert str(info.value) == (
        f"model.safetensors in {run} is damaged: its tensor '{name}' holds {what} values; "
        "replace the file with an intact copy"
    )


def test_nan_weights_stop_generate_with_the_sentence(tmp_path, capsys):
    """Before, `generate --greedy` printed nothing and exited 0."""
    run = tiny_run(tmp_path / "run", "decoder")
    rewrite_weights(run, lambda t: t["embed.token.weight"].fill_(float("nan")))
    assert main(["generate", str(run), "--prompt", "a", "--greedy"]) == 2
    assert "is damaged: its tensor 'embed.token.weight' holds NaN values" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncated", "header"])
def test_a_truncated_or_garbled_file_is_named_as_damaged_not_as_a_misfit(tmp_path, damage):
    run = tiny_run(tmp_path / "run", "decoder")
    weights = run / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else data[:8] + b"#" * 40)
    with pytest.raises(AttnkitError, match=rf"^model.safetensors in {run} is damaged \(.*\): the"):
        load_run(run)


def test_weights_of_another_model_still_do_not_fit(tmp_path):
    run = tiny_run(tmp_path / "run", "decoder")
    save_pretrained(tiny_model("decoder", d_model=32), tmp_path / "other")
    (run / "model.safetensors").write_bytes((tmp_path / "other" / "model.safetensors").read_bytes())
    with pytest.raises(AttnkitError, match="do not fit the model of 'decoder' shape"):
        load_run(run)


def test_a_config_whose_d_model_was_edited_gets_one_sentence(tmp_path, capsys):
    """It printed torch's 15-line dump of every tensor after its first sentence (issue 39)."""
    run = tiny_run(tmp_path / "run", "decoder")
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "d_model": 2 * config["d_model"]}))
    with pytest.raises(AttnkitError) as info:
        load_run(run)
    message = str(info.value)
    assert "\n" not in message
    assert re.search(r"shape and its config: \d\d+ tensors differ \(size mismatch for ", message)
    assert message.endswith("was config.json edited after training? put back the one trained with")
    assert main(["generate", str(run), "--prompt", "a"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_hugging_face_folder_is_told_to_be_imported_first(hf_folder, capsys):
    """It got "ModelConfig has no field 'activation_function'" (issue 39, misleading)."""
    with pytest.raises(AttnkitError, match=r"is a Hugging Face model folder \(gpt2\), not an"):
        load_run(hf_folder)
    assert main(["generate", str(hf_folder), "--prompt", "a"]) == 2
    assert f"import it first with `attnkit import hf {hf_folder} RUN_DIR`" in (
        capsys.readouterr().err
    )


def test_an_unknown_device_gets_its_own_sentence(lm_run, capsys):
    with pytest.raises(AttnkitError, match="device 'banana' is not a device torch knows; use cpu"):
        load_run(lm_run, "banana")
    assert main(["generate", str(lm_run), "--prompt", "a", "--device", "banana"]) == 2
    assert "do not fit" not in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_machine_without_a_gpu_gets_its_own_sentence(mt_run):
    with pytest.raises(AttnkitError, match="device 'cuda' is not available: torch finds no CUDA"):
        load_run(mt_run, "cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_the_machine_does_not_have_gets_its_own_sentence(mt_run):
    count = torch.cuda.device_count()
    with pytest.raises(AttnkitError, match=f"this machine has {count} CUDA device"):
        load_run(mt_run, f"cuda:{count}")


# -- a tokenizer of another model (must 7) ---------------------------------------------------


def other_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """A character tokenizer of the same size whose ids mean other characters."""
    other = Tokenizer.train("char", texts=[line.upper()[::-1] for line in RUN_LINES] * 3)
    assert other.vocab_size == tokenizer.vocab_size and other.fingerprint != tokenizer.fingerprint
    return other


def test_a_tokenizer_of_another_model_of_the_same_size_is_refused(tmp_path, capsys):
    run = tiny_run(tmp_path / "run", "encoder-decoder")
    folder = RunFolder(run)
    own = folder.load_tokenizer()
    folder.record_tokenizer(own)
    other_tokenizer(own).save(folder.tokenizer)
    with pytest.raises(AttnkitError) as info:
        load_run(run)
    assert str(info.value).startswith(
        f"{folder.tokenizer} is not the tokenizer the model of {run} was made with (its "
        f"vocabulary's fingerprint is {other_tokenizer(own).fingerprint}, the run recorded "
        f"{own.fingerprint}); put the run's own tokenizer.json back, or, if you know the ids "
        "agree, pass --ignore-tokenizer-mismatch"
    )
    assert load_run(run, check_tokenizer=False).tokenizer.fingerprint != own.fingerprint
    source = tmp_path / "source.txt"
    source.write_text("ein hund\n")
    assert main(["translate", str(run), "--input", str(source), "--no-progress"]) == 2
    assert "is not the tokenizer the model of" in capsys.readouterr().err
    flag = "--ignore-tokenizer-mismatch"
    assert main(["translate", str(run), "--input", str(source), "--no-progress", flag]) == 0


def test_a_tokenizer_copied_with_its_fingerprint_file_is_refused(tmp_path):
    """`cp other_run/tokenizer* run/` brought its fingerprint along and generated silently with
    the wrong vocabulary (issue 39, BAD 3): the weights carry the fingerprint now."""
    run, other = tiny_run(tmp_path / "run", "decoder"), tiny_run(tmp_path / "other", "decoder")
    own = RunFolder(run).load_tokenizer(check=False)
    RunFolder(run).record_tokenizer(own)
    theirs = other_tokenizer(own)
    theirs.save(RunFolder(other).tokenizer)
    RunFolder(other).record_tokenizer(theirs)
    for path in Path(other).glob("tokenizer*"):
        shutil.copy(path, run / path.name)
    assert RunFolder(run).fingerprint.read_text().strip() == theirs.fingerprint
    with pytest.raises(AttnkitError, match=f"the run recorded {own.fingerprint}"):
        load_run(run)
    assert load_run(other).tokenizer.fingerprint == theirs.fingerprint


def test_a_trained_run_binds_its_weights_to_its_tokenizer(tmp_path):
    """Every weights file a training writes carries the fingerprint: the model, each step's,
    the best, and the average of the last steps."""
    assert main(["train", translation_config(tmp_path)]) == 0  # averages the last 2 steps
    folder = RunFolder(tmp_path / "run")
    fingerprint = folder.load_tokenizer().fingerprint
    for path in [folder.weights, folder.best_weights, *map(folder.step_weights, [2, 4])]:
        with safe_open(str(path), "pt") as weights:
            assert weights.metadata()[FINGERPRINT_KEY] == fingerprint, path


def test_a_run_without_a_fingerprint_loads_and_says_so_once(tmp_path, caplog):
    run = tiny_run(tmp_path / "run", "decoder")
    own = RunFolder(run).load_tokenizer(check=False)
    other_tokenizer(own).save(RunFolder(run).tokenizer)
    assert not RunFolder(run).fingerprint.exists()
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        assert load_run(run).tokenizer.vocab_size == own.vocab_size
        load_run(run)
    said = [r.getMessage() for r in caplog.records if "record no fingerprint" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"{run}: its weights record no fingerprint")
    RunFolder(run).record_tokenizer(own)  # binds the weights already there
    with pytest.raises(AttnkitError, match="is not the tokenizer the model of"):
        load_run(run)


def test_an_import_records_the_fingerprint_of_its_tokenizer(hf_folder, tmp_path):
    import_hf(hf_folder, tmp_path / "run")
    folder = RunFolder(tmp_path / "run")
    own = Tokenizer.load(hf_folder)
    assert folder.fingerprint.read_text().strip() == own.fingerprint
    other_tokenizer(own).save(folder.tokenizer)
    with pytest.raises(AttnkitError, match="is not the tokenizer the model of"):
        load_run(folder.root)


# -- file modes --------------------------------------------------------------------------------


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_saved_files_get_the_mode_the_umask_gives(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        save_pretrained(tiny_model("decoder"), tmp_path / "run")
        reverse_tokenizer().save(tmp_path / "run")
    finally:
        os.umask(old)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (tmp_path / "run" / name).stat().st_mode & 0o777 == mode, name


def test_integer_weights_are_said_to_be_cast_and_half_floats_are_not(tmp_path, caplog):
    """int64 weights were cast silently on load (issue 39, POOR); float16 is fine."""
    for dtype, said in ((torch.int64, True), (torch.float16, False)):
        run = tiny_run(tmp_path / str(dtype), "decoder")

        def retype(tensors, dtype=dtype):
            for name in tensors:
                tensors[name] = tensors[name].to(dtype)

        rewrite_weights(run, retype)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="attnkit"):
            load_pretrained(run)
        assert ("tensors are stored as integers" in caplog.text) == said
        if said:
            assert "and were cast to torch.float32; a model's weights are floats" in caplog.text
