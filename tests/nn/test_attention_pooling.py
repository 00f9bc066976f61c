"""Attention pooling with a learned query: its formula by hand, padding masked, mean pooling
at the start, its registration as a pooling mode, and a query that learns which token counts."""

import math

import pytest
import torch

from attnkit.errors import AttnkitError
from attnkit.nn.attention_pooling import AttentionPooling
from attnkit.pooling import Pooling, mean_pool, pool


def test_the_pooled_vector_is_softmax_of_q_k_over_sqrt_d_times_v() -> None:
    torch.manual_seed(0)
    d = 6
    pooling = AttentionPooling(d)
    with torch.no_grad():
        pooling.query.copy_(torch.randn(d))
    hidden = torch.randn(2, 4, d)
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    got = pooling(hidden, mask)
    q = pooling.query.tolist()
    for b in range(2):
        real = [t for t in range(4) if mask[b, t]]
        scores = [
            sum(qi * h for qi, h in zip(q, hidden[b, t].tolist(), strict=True)) / math.sqrt(d)
            for t in real
        ]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        weights = [w / sum(weights) for w in weights]
        by_hand = [
            sum(w * float(hidden[b, t, i]) for w, t in zip(weights, real, strict=True))
            for i in range(d)
        ]
        assert got[b].tolist() == pytest.approx(by_hand, abs=1e-6)


def test_padding_never_moves_the_vector() -> None:
    torch.manual_seed(1)
    pooling = AttentionPooling(4)
    with torch.no_grad():
        pooling.query.normal_()
    hidden = torch.randn(1, 5, 4)
    mask = torch.tensor([[True, True, True, False, False]])
    changed = hidden.clone()
    changed[:, 3:] = 1e4
    torch.testing.assert_close(pooling(hidden, mask), pooling(changed, mask))
    torch.testing.assert_close(pooling(hidden, mask), pooling(hidden[:, :3], mask[:, :3]))
    assert pooling.weights(hidden, mask)[0, 3:].eq(0).all()


def test_a_new_attention_pooling_is_mean_pooling() -> None:
    hidden, mask = torch.randn(3, 5, 8), torch.tensor([[1, 1, 1, 0, 0]] * 3).bool()
    torch.testing.assert_close(AttentionPooling(8)(hidden, mask), mean_pool(hidden, mask))


def test_the_attention_mode_pools_with_the_module_it_is_given() -> None:
    torch.manual_seed(2)
    pooling = AttentionPooling(4)
    with torch.no_grad():
        pooling.query.normal_()
    hidden, mask = torch.randn(2, 3, 4), torch.ones(2, 3, dtype=torch.bool)
    chosen = Pooling(modes=("attention",), normalize=False)
    torch.testing.assert_close(pool(hidden, mask, chosen, pooling), pooling(hidden, mask))
    with pytest.raises(AttnkitError, match="learned query"):
        pool(hidden, mask, chosen)


def test_the_query_learns_to_find_the_token_that_decides() -> None:
    """One token among noise decides the class, and carries a marker the query can find:
    training moves the weight onto it from the 1/12 of mean pooling."""
    torch.manual_seed(3)
    d, length = 8, 12
    marker = torch.zeros(d)
    marker[0] = 4.0
    hidden = torch.randn(256, length, d)
    hidden[:, :, 0] = 0.0
    where = torch.randint(length, (256,))
    sign = torch.randint(2, (256,)) * 2 - 1
    hidden[torch.arange(256), where] += marker
    hidden[torch.arange(256), where, 1] = sign.float() * 3
    labels = (sign > 0).long()
    mask = torch.ones(256, length, dtype=torch.bool)
    pooling = AttentionPooling(d)
    head = torch.nn.Linear(d, 2)
    optimizer = torch.optim.Adam([*pooling.parameters(), *head.parameters()], lr=0.05)
    for _ in range(150):
        loss = torch.nn.functional.cross_entropy(head(pooling(hidden, mask)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    weights = pooling.weights(hidden, mask).detach()
    assert float(weights[torch.arange(256), where].mean()) > 0.4  # from 1/12 at the start
    with torch.no_grad():
        accuracy = (head(pooling(hidden, mask)).argmax(-1) == labels).float().mean()
    assert float(accuracy) > 0.95
