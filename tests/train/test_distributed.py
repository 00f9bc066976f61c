import json

import pytest
import torch

from tests.helpers import parallel_model, run_worker

TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The worker's runs on two gloo processes (one launch for both tests)."""
    out = tmp_path_factory.mktemp("two")
    run_worker([*TORCHRUN, "-m", "tests.train.ddp_worker"], out)
    return out


def test_two_gloo_processes_match_one_process_with_the_same_global_batch(two_ranks, tmp_path):
    """Each rank trains on half of every global batch (halves of unequal token counts)."""
    run_worker(["-m", "tests.train.ddp_worker"], tmp_path)
    single = torch.load(tmp_path / "params.pt", weights_only=True)
    double = torch.load(two_ranks / "params.pt", weights_only=True)
    assert single.keys() == double.keys()
    for name, value in single.items():
        torch.testing.assert_close(double[name], value, rtol=1e-5, atol=1e-6, msg=name)
    initial = parallel_model()
    assert not torch.equal(initial.state_dict()["head.weight"], single["head.weight"])


def test_ranks_agree_on_the_rate_a_time_budget_sets_though_their_clocks_differ(two_ranks):
    """`decay_over = "minutes"`: each rank's own clock would give it its own rate, and the
    replicas would drift apart; the session's clock is agreed, so they stay equal."""
    ranks = [torch.load(two_ranks / f"budgeted{r}.pt", weights_only=True) for r in (0, 1)]
    for name, value in ranks[0].items():
        assert torch.equal(ranks[1][name], value), name
    records = [json.loads(line) for line in (two_ranks / "budgeted" / "metrics.jsonl").open()]
    rates = [r["lr"] for r in records if "lr" in r]
    assert len(rates) > 3 and rates[-1] < 0.5 * rates[0]  # the budget did set the rate
