"""The served models of the API's tests: a decoder, an encoder and an encoder-decoder, tiny."""

from __future__ import annotations

import pytest

from attnkit.serve.runs import Served, served_runs
from tests.helpers import tiny_run


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> list[Served]:
    tmp = tmp_path_factory.mktemp("runs")
    shapes = (("gpt", "decoder"), ("bert", "encoder"), ("mt", "encoder-decoder"))
    return served_runs([f"{name}={tiny_run(tmp / name, shape)}" for name, shape in shapes])
