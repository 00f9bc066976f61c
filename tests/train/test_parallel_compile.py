"""torch.compile per Block under FSDP2 (`train.compile_scope = "block"`), on two gloo ranks."""

import torch

from tests.helpers import run_worker

TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def test_blocks_compiled_under_fsdp_train_as_the_eager_sharded_model(tmp_path):
    run_worker([*TORCHRUN, "-m", "tests.train.compile_worker"], tmp_path)
    report = torch.load(tmp_path / "report.pt")
    assert report["blocks"] == 2 and report["blocks_compiled"]
    assert report["graphs"] >= 1  # inductor compiled the Blocks' forward
    assert not any("_orig_mod" in key for key in report["keys"])  # the names stay plain
    assert len(report["compiled"]) == len(report["eager"]) == 2
    torch.testing.assert_close(report["compiled"], report["eager"], rtol=1e-4, atol=1e-5)
