import torch

from tests.helpers import parallel_model, run_worker


def run(args: list[str], out) -> dict[str, torch.Tensor]:
    run_worker(args, out)
    return torch.load(out / "params.pt", weights_only=True)


def test_two_gloo_processes_match_one_process_with_the_same_global_batch(tmp_path):
    """Each rank trains on half of every global batch (halves of unequal token counts)."""
    worker = ["-m", "tests.train.ddp_worker"]
    single = run(worker, tmp_path / "one")
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    double = run([*torchrun, "-m", "tests.train.ddp_worker"], tmp_path / "two")
    assert single.keys() == double.keys()
    for name, value in single.items():
        torch.testing.assert_close(double[name], value, rtol=1e-5, atol=1e-6, msg=name)
    initial = parallel_model()
    assert not torch.equal(initial.state_dict()["head.weight"], single["head.weight"])
