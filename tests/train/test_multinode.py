"""Two "nodes" on one machine: two torchrun agents meeting at 127.0.0.1 (c10d rendezvous),
one process each, training one run through `attnkit train` with FSDP on gloo."""

import os
import socket
import subprocess
import sys

from attnkit.run import RunFolder, load_run
from attnkit.train.checkpoint import load_trainer_state
from tests.helpers import ROOT, translation_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_train_one_run_with_the_tokenizer_rank_0_made(tmp_path):
    """The CLI's tiny translation under FSDP: the BLEU of greedy decoding on validation takes
    every rank too (each decodes; FSDP's forward passes are collectives)."""
    config = translation_config(tmp_path)
    fsdp = ["--set", "train.parallel=fsdp", "--set", "train.device=cpu", "--set", "eval.every=4"]
    launch = [
        *(sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1"),
        *("--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}"),
        *("-m", "tests.train.node_worker", "train", config, *fsdp),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env["OMP_NUM_THREADS"] = "1"
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    nodes = [subprocess.Popen(launch, env=env, cwd=ROOT, **pipes) for _ in range(2)]
    try:  # a node that fails can leave the other waiting for it: stop both after the timeout
        outputs = [node.communicate(timeout=180)[0] for node in nodes]
    finally:
        for node in nodes:  # SIGTERM: torchrun stops its worker (SIGKILL after 30 s)
            node.terminate()
            node.wait(timeout=60)
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(o[-4000:] for o in outputs)
    folder = RunFolder(tmp_path / "run")
    assert load_trainer_state(folder)["step"] == 4
    # Each "node" wrote its own slice of the sharded checkpoint into the one run folder.
    assert sorted(p.name for p in folder.step_shards(4).glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    run = load_run(folder.root)
    assert run.model.config.vocab_size == run.tokenizer.vocab_size
    evaluation = [r for r in folder.read_metrics() if "val_loss" in r]
    assert len(evaluation) == 1 and "bleu" in evaluation[0]
