"""A model named by its Hub id (ORG/NAME), as transformers users type it: `attnkit import hf`
reads its snapshot from the huggingface_hub cache, offline too; an id the cache lacks while
offline, and a folder that does not exist, are refused in one sentence each. `attnkit serve`
takes an id where it takes a run, imported once into attnkit's cache and reused after.

The cache is one the tests build (HF_HUB_CACHE in tmp_path, in huggingface_hub's layout), and
HF_HUB_OFFLINE=1 keeps every test off the network.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants
from safetensors.torch import load_file

from attnkit import AttnkitError
from attnkit.cli import main
from attnkit.interop import hub_runs, import_hf
from attnkit.run import RunFolder, load_run
from attnkit.serve.runs import served_runs
from attnkit.tokenizer import Tokenizer


def hub_cache(cache: Path, repo_id: str, folder: Path) -> str:
    """Put the files of `folder` into `cache` as huggingface_hub keeps a download of `repo_id`:
    each file's bytes in models--ORG--NAME/blobs/, linked from snapshots/REV/ under its name,
    and refs/main naming REV. The revision's hash."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    revision = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot, blobs = repo / "snapshots" / revision, repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for file in folder.iterdir():
        blob = blobs / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return revision


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hub cache, offline: in the environment (for a subprocess) and in
    huggingface_hub's constants, which it reads from the environment once, when imported."""
    cache = tmp_path / "hub"
    cache.mkdir()
    for name, value in (("HF_HUB_CACHE", str(cache)), ("HF_HUB_OFFLINE", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_hub_id_in_the_cache_is_imported_offline_from_the_command_line(
    hf_folder, offline_cache, tmp_path
):
    hub_cache(offline_cache, "tiny-org/tiny-gpt2", hf_folder)
    done = subprocess.run(
        [sys.executable, "-m", "attnkit", "import", "hf", "tiny-org/tiny-gpt2", "run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    weights = load_file(tmp_path / "run" / "model.safetensors")
    import_hf(hf_folder, tmp_path / "from the folder")
    expected = load_file(tmp_path / "from the folder" / "model.safetensors")
    assert weights.keys() == expected.keys()
    assert all(weights[name].equal(expected[name]) for name in expected)
    tokenizer = RunFolder(tmp_path / "run").load_tokenizer()
    assert tokenizer.fingerprint == Tokenizer.load(hf_folder).fingerprint


def test_a_hub_id_is_a_source_for_the_python_import_too(hf_folder, offline_cache, tmp_path):
    hub_cache(offline_cache, "gpt2-tiny", hf_folder)  # an id without an organisation
    imported = import_hf("gpt2-tiny", tmp_path / "run")
    assert imported.model_type == "gpt2" and (tmp_path / "run" / "tokenizer.json").is_file()


def test_an_id_the_cache_lacks_while_offline_names_hf_hub_offline_and_the_folder_form(
    offline_cache, tmp_path, capsys
):
    assert main(["import", "hf", "tiny-org/absent", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnkit: error: tiny-org/absent is not a folder here, the Hugging")
    assert "HF_HUB_OFFLINE" in err and "attnkit import hf PATH/TO/MODEL RUN_DIR" in err
    assert str(offline_cache) in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("source", ["./no/such/model", "../models/absent", "no/such/model"])
def test_a_folder_that_does_not_exist_is_named_as_missing(offline_cache, tmp_path, source):
    """Not "has no config.json": there is no folder at all (a path, not an id)."""
    with pytest.raises(AttnkitError, match=f"^there is no folder {source}; give a Hugging"):
        import_hf(source, tmp_path / "run")


def test_serve_takes_a_hub_id_imported_once_into_attnkits_cache(
    hf_folder, offline_cache, isolated_cache, tmp_path, monkeypatch
):
    revision = hub_cache(offline_cache, "tiny-org/tiny-gpt2", hf_folder)
    conversions = []

    def counted(*args, **kwargs):
        conversions.append(args)
        return import_hf(*args, **kwargs)

    monkeypatch.setattr(hub_runs, "import_hf", counted)
    (served,) = served_runs(["tiny-org/tiny-gpt2"])
    assert served.name == "tiny-gpt2" and len(conversions) == 1
    folder = isolated_cache.parent / "hub-runs" / "tiny-org--tiny-gpt2" / revision
    assert served.run.folder.root == folder and sorted(p.name for p in folder.parent.iterdir()) == [
        revision
    ]  # the stage was renamed into place, nothing half-made beside it
    (tmp_path / "plain").mkdir()
    assert folder.stat().st_mode == (tmp_path / "plain").stat().st_mode  # the umask's mode
    import_hf(hf_folder, tmp_path / "imported")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        expected = load_run(tmp_path / "imported").model(ids).logits
        assert torch.equal(served.model(ids).logits, expected)
    made = (folder / "model.safetensors").stat().st_mtime_ns
    (again,) = served_runs(["mine=tiny-org/tiny-gpt2"])  # a later start: the same folder
    assert again.name == "mine" and again.run.folder.root == folder and len(conversions) == 1
    assert (folder / "model.safetensors").stat().st_mtime_ns == made


def test_a_start_killed_while_converting_leaves_no_half_run(
    hf_folder, offline_cache, isolated_cache, monkeypatch
):
    hub_cache(offline_cache, "tiny-org/tiny-gpt2", hf_folder)

    def killed(source, stage, **kwargs):
        (Path(stage) / "config.json").write_text("{}")  # begun, never finished
        raise KeyboardInterrupt

    monkeypatch.setattr(hub_runs, "import_hf", killed)
    with pytest.raises(KeyboardInterrupt):
        served_runs(["tiny-org/tiny-gpt2"])
    assert not any((isolated_cache.parent / "hub-runs" / "tiny-org--tiny-gpt2").iterdir())
    monkeypatch.setattr(hub_runs, "import_hf", import_hf)
    (served,) = served_runs(["tiny-org/tiny-gpt2"])  # the next start converts it whole
    assert served.run.folder.root.is_dir() and served.name == "tiny-gpt2"


def test_serving_an_id_the_cache_lacks_while_offline_is_import_hfs_one_sentence(
    offline_cache, isolated_cache, capsys
):
    assert main(["serve", "tiny-org/absent", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnkit: error: tiny-org/absent is not a folder here, the Hugging")
    assert "HF_HUB_OFFLINE" in err and "attnkit import hf PATH/TO/MODEL RUN_DIR" in err
    assert len(err.strip().splitlines()) == 1
    assert not (isolated_cache.parent / "hub-runs").exists()
