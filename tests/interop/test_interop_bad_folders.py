"""Hugging Face folders that are not what they seem: an attnkit run folder, a
pytorch_model.bin that is no state dict or holds Python objects, files that lead outside the
folder, weights holding NaN or Inf. Each is refused in one sentence that never suggests
unpickling what attnkit will not."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnkit import AttnkitError
from attnkit.interop import import_hf, load_hf
from attnkit.run import RunFolder
from attnkit.tokenizer import Tokenizer
from tests.helpers import rewrite_weights


def test_importing_an_attnkit_run_folder_says_it_is_one_already(mt_run, tmp_path):
    with pytest.raises(AttnkitError, match=r"is already an attnkit run folder \(its config.json"):
        import_hf(mt_run, tmp_path / "run")


def bin_folder(hf_folder: Path, content) -> Path:
    """`hf_folder` with its weights as a pytorch_model.bin holding `content`."""
    (hf_folder / "model.safetensors").unlink()
    torch.save(content, hf_folder / "pytorch_model.bin")
    return hf_folder


@pytest.mark.parametrize(
    "content, what",
    [
        ([torch.zeros(2)], "a list"),
        ({"model": {"wte.weight": torch.zeros(2)}, "step": 3}, "a dict whose entry 'model' is a"),
        (torch.zeros(2), "a Tensor"),
    ],
)
def test_a_bin_that_is_not_a_state_dict_is_refused(hf_folder, content, what):
    bin_folder(hf_folder, content)
    with pytest.raises(AttnkitError, match=f"holds {what}.*, not a state dict of tensor names"):
        load_hf(hf_folder)


class Payload:
    """A class a pickle names: unpickling it would run code of the file's choosing."""


def test_a_bin_holding_python_objects_is_refused_without_torch_s_advice(hf_folder):
    bin_folder(hf_folder, {"wte.weight": torch.zeros(2), "extra": Payload()})
    with pytest.raises(AttnkitError) as info:
        load_hf(hf_folder)
    message = str(info.value)
    assert f"holds Python objects ({__name__}.Payload) besides tensors" in message
    assert "will not unpickle because unpickling can run code" in message
    assert "weights_only" not in message and "\n" not in message


def test_a_bin_of_garbage_is_named_as_damaged(hf_folder):
    (hf_folder / "model.safetensors").unlink()
    (hf_folder / "pytorch_model.bin").write_bytes(b"garbage, not a pickle")
    with pytest.raises(AttnkitError, match="is damaged or not a PyTorch weights file"):
        load_hf(hf_folder)


def test_a_tokenizer_json_linking_outside_the_folder_is_refused(hf_folder, tmp_path):
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY")
    (hf_folder / "tokenizer.json").unlink()
    (hf_folder / "tokenizer.json").symlink_to(secret)
    with pytest.raises(AttnkitError, match=r"tokenizer.json leads outside .*hf \(to .*id_rsa\)"):
        import_hf(hf_folder, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_links_of_the_hugging_face_cache_are_followed(hf_folder, tmp_path):
    """The cache keeps each file in blobs/ and links it from snapshots/REV/."""
    model = tmp_path / "hub" / "models--org--tiny"
    snapshot, blobs = model / "snapshots" / "0123abc", model / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for file in hf_folder.iterdir():
        blob = blobs / f"sha-{file.name}"
        blob.write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    import_hf(snapshot, tmp_path / "run")
    assert (
        RunFolder(tmp_path / "run").load_tokenizer().fingerprint
        == Tokenizer.load(hf_folder).fingerprint
    )


def shard(hf_folder: Path, name: str) -> dict[str, torch.Tensor]:
    """Turn the weights of `hf_folder` into one shard that the index names `name`."""
    tensors = load_file(hf_folder / "model.safetensors")
    (hf_folder / "model.safetensors").rename(hf_folder / "model-00001-of-00001.safetensors")
    index = {"weight_map": dict.fromkeys(tensors, name)}
    (hf_folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return tensors


def test_shards_inside_the_folder_are_read(hf_folder):
    tensors = shard(hf_folder, "model-00001-of-00001.safetensors")
    state = load_hf(hf_folder).model.state_dict()
    assert torch.equal(state["embed.token.weight"], tensors["transformer.wte.weight"])


@pytest.mark.parametrize("name", ["../outside.safetensors", "/tmp/outside.safetensors"])
def test_a_shard_index_naming_a_path_outside_the_folder_is_refused(hf_folder, name):
    shard(hf_folder, name)
    with pytest.raises(AttnkitError, match=rf"the shard '{name}' named in .* leads outside"):
        load_hf(hf_folder)


def test_nan_in_hugging_face_weights_is_named_as_damaged(hf_folder):
    rewrite_weights(hf_folder, lambda t: t["transformer.wpe.weight"].fill_(float("inf")))
    with pytest.raises(AttnkitError, match=r"'transformer\.wpe\.weight' holds infinite values"):
        load_hf(hf_folder)
