"""T5's relative position bias: transformers' buckets for every distance, one table a stack."""

import pytest
import torch

from attnkit.nn.relative_bias import RelativePositionBias, relative_buckets
from tests.helpers import tiny_model


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("buckets", "distance"), [(32, 128), (8, 20), (6, 7)])
def test_buckets_are_those_of_transformers_t5(bidirectional, buckets, distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = torch.arange(-400, 401)
    ours = relative_buckets(relative, bidirectional, buckets, distance)
    theirs = T5Attention._relative_position_bucket(relative, bidirectional, buckets, distance)
    assert torch.equal(ours, theirs)


def test_buckets_are_exact_near_and_log_spaced_far():
    b = relative_buckets(torch.arange(0, 200), False, 32, 128)  # looking back: j - i <= 0
    assert b[:1].tolist() == [0]
    back = relative_buckets(-torch.arange(0, 200), False, 32, 128)
    assert back[:16].tolist() == list(range(16))  # exact up to B / 2
    assert back[128:].eq(31).all()  # all beyond max_distance share the last
    assert (back.diff() >= 0).all()


def test_the_bias_reads_each_distance_from_its_bucket():
    bias = RelativePositionBias(2, 8, 20, 16, bidirectional=True, init_std=1.0)
    distance = torch.arange(5)[:, None] - torch.arange(5)[None]  # i - j
    out = bias(distance)
    assert out.shape == (1, 2, 5, 5)
    buckets = relative_buckets(-distance, True, 8, 20)
    torch.testing.assert_close(out[0, 1], bias.weight[buckets, 1])


def test_one_table_a_stack_shared_by_its_layers():
    model = tiny_model(layers=2, positional="t5-relative")
    tables = [n for n, _ in model.named_parameters() if "relative_bias" in n]
    assert tables == ["encoder.relative_bias.weight", "decoder.relative_bias.weight"]
    assert model.decoder.relative_bias.buckets.max() < 32
