"""Ranks started wrong fail fast, in one sentence (issue 53, POOR): `WORLD_SIZE=two` and a
missing `RANK` reached the catch-all sentence, and `WORLD_SIZE=3` with two ranks or `RANK=5` of
two printed nothing and waited for torch's 30-minute timeout. What torchrun would never set is
refused at once; a rank that never comes is named after `train.rendezvous_timeout` seconds."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import torch.distributed

from attnkit import AttnkitError
from attnkit.cli import main
from attnkit.train import distributed as dist
from tests.helpers import translation_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ranks(monkeypatch: pytest.MonkeyPatch):
    """Sets torchrun's variables as given (None: unset)."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)

    def set_env(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_env


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE is 'two', which should be a whole number"),
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE is 2 but RANK is not set"),
        ({"WORLD_SIZE": "2", "RANK": "5"}, "RANK is 5, but WORLD_SIZE 2 counts ranks 0 to 1"),
        ({"WORLD_SIZE": "2", "RANK": "x"}, "RANK is 'x', which should be a whole number"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE is 0, not a number of processes"),
    ],
    ids=["world-size-two", "no-rank", "rank-past", "rank-x", "world-size-0"],
)
def test_what_torchrun_never_sets_is_one_sentence(tmp_path, ranks, env, said, capsys) -> None:
    ranks(**env)
    assert main(["train", translation_config(tmp_path), "--set", "train.device=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and err.count("\n") == 0 and "did not expect" not in err


def test_a_rank_that_never_comes_is_named_after_the_timeout(ranks) -> None:
    ranks(WORLD_SIZE="2", RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    began = time.monotonic()
    with pytest.raises(AttnkitError, match=r"rank 0 of WORLD_SIZE 2 waited 1 s \(train\.rende"
                       r"zvous_timeout\) for the other ranks to join its store .*1/2"):  # fmt: skip
        dist.setup("cpu", timeout=1)
    assert time.monotonic() - began < 60
    assert not torch.distributed.is_initialized()


def test_a_rank_without_rank_0_is_named_after_the_timeout(ranks) -> None:
    ranks(WORLD_SIZE="2", RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with pytest.raises(AttnkitError, match=r"rank 1 of WORLD_SIZE 2 waited 1 s .* for rank 0's "
                       "store at 127.0.0.1:"):  # fmt: skip
        dist.setup("cpu", timeout=1)
    assert not torch.distributed.is_initialized()


def test_the_rendezvous_timeout_is_a_positive_setting() -> None:
    from attnkit.train.run_config import TrainSection

    assert TrainSection().rendezvous_timeout == 300
    with pytest.raises(AttnkitError, match=r"train\.rendezvous_timeout"):
        TrainSection(rendezvous_timeout=0)


def test_two_ranks_started_as_three_stop_in_one_sentence_each(tmp_path) -> None:
    """The issue's own case: WORLD_SIZE=3 with two ranks, each through the command line."""
    import os
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    config = translation_config(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    env.update(WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-m", "attnkit", "train", config, "--set", "train.device=cpu"]
    command += ["--set", "train.rendezvous_timeout=3"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    ranks = [subprocess.Popen(command, env={**env, "RANK": str(r)}, **pipes) for r in (0, 1)]
    try:
        errs = [rank.communicate(timeout=120)[1] for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
    assert [rank.returncode for rank in ranks] == [2, 2], errs
    said = [err.strip().splitlines()[-1] for err in errs]
    assert said[0].startswith("attnkit: error: rank 0 of WORLD_SIZE 3 waited 3 s"), said
    assert "2/3" in said[0] and "start as many ranks as WORLD_SIZE counts" in said[0]
    assert said[1].startswith("attnkit: error: rank 1 "), said
    assert all("Traceback" not in err for err in errs)
