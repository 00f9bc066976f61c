"""Shared test settings: deterministic, single-threaded torch for small fast tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def pytest_configure() -> None:
    # Tiny models gain nothing from threads; one thread keeps runs steady on a shared machine.
    torch.set_num_threads(1)
