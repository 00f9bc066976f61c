"""A sentence-transformers folder's pooling, read on import and kept in the run folder with the
tokenizer's settings (its chat template); a module attnkit does not run is named."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.interop import import_hf, save_hf
from attnkit.interop.sentence_transformers import read_pooling
from attnkit.models import build_model
from attnkit.pooling import Pooling
from attnkit.run import RunFolder
from attnkit.tokenizer import Tokenizer
from tests.helpers import RUN_LINES

SMALL = {"vocab_size": 40, "d_model": 16, "n_heads": 2, "d_ff": 32, "n_encoder_layers": 1,
         "max_len": 32, "n_token_types": 2, "embedding_norm": True}  # BERT's  # fmt: skip


def _folder(path: Path, modules: list[dict], pooling: dict | None) -> Path:
    torch.manual_seed(0)
    tokenizer = Tokenizer.train("char", texts=RUN_LINES * 3)
    model = build_model(ModelConfig.from_preset("bert-mini", **SMALL))
    tokenizer.save(save_hf(model, path))
    (path / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (path / "1_Pooling").mkdir()
        (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 24}))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    return path


MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
]


def test_an_import_keeps_the_pooling_and_the_tokenizer_settings(tmp_path: Path) -> None:
    flags = {"pooling_mode_cls_token": True, "pooling_mode_max_tokens": True}
    src = _folder(tmp_path / "hf", MODULES, flags)
    import_hf(src, tmp_path / "run")
    folder = RunFolder(tmp_path / "run")
    assert folder.read_pooling() == Pooling(("cls", "max"), normalize=False, max_tokens=24)
    assert json.loads(folder.tokenizer_config.read_text())["chat_template"] == "{{ messages }}"


def test_normalize_and_the_newer_pooling_mode_field(tmp_path: Path) -> None:
    modules = [*MODULES, {"idx": 2, "name": "2", "path": "2_Normalize",
                          "type": "sentence_transformers.models.Normalize"}]  # fmt: skip
    src = _folder(tmp_path / "hf", modules, {"pooling_mode": "lasttoken"})
    assert read_pooling(src) == Pooling(("lasttoken",), normalize=True, max_tokens=24)


def test_a_module_attnkit_does_not_run_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    modules = [*MODULES, {"idx": 2, "name": "2", "path": "2_Dense",
                          "type": "sentence_transformers.models.Dense"}]  # fmt: skip
    src = _folder(tmp_path / "hf", modules, {"pooling_mode_mean_tokens": True})
    with caplog.at_level(logging.WARNING):
        assert read_pooling(src) == Pooling(("mean",), normalize=False, max_tokens=24)
    assert "Dense, which attnkit does not run" in caplog.text


def test_a_folder_without_modules_has_no_pooling_and_a_broken_one_is_named(
    tmp_path: Path,
) -> None:
    src = _folder(tmp_path / "hf", MODULES, None)
    with pytest.raises(AttnkitError, match=r"1_Pooling/config\.json is missing"):
        read_pooling(src)
    (src / "modules.json").unlink()
    assert read_pooling(src) is None
