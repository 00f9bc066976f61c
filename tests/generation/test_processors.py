"""Logits processors: top-k, top-p, temperature, min length, no-repeat n-grams, suppressed ids."""

import itertools

import torch

from attnkit.generation import generate, warp
from tests.helpers import peaked, source_batch


def test_top_p_keeps_the_smallest_set_reaching_p_on_a_known_distribution():
    logits = torch.tensor([[0.15, 0.05, 0.5, 0.3]]).log()
    kept = {
        p: set(torch.isfinite(warp(logits, top_p=p))[0].nonzero().flatten().tolist())
        for p in (0.4, 0.75, 0.9, 0.99, 1.0)
    }
    assert kept == {0.4: {2}, 0.75: {2, 3}, 0.9: {0, 2, 3}, 0.99: {0, 1, 2, 3}, 1.0: {0, 1, 2, 3}}


def test_top_p_matches_a_brute_force_on_random_distributions():
    torch.manual_seed(0)
    logits = torch.randn(50, 12) * 2
    for p in (0.3, 0.6, 0.9):
        kept = torch.isfinite(warp(logits, top_p=p))
        probs = logits.softmax(-1)
        for row in range(logits.shape[0]):
            order = probs[row].argsort(descending=True).tolist()
            total, expected = 0.0, set()
            for token in order:
                expected.add(token)
                total += probs[row, token].item()
                if total >= p:
                    break
            assert set(kept[row].nonzero().flatten().tolist()) == expected


def test_top_k_and_temperature():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert torch.isfinite(warp(logits, top_k=2)).tolist() == [[False, True, True, False]]
    torch.testing.assert_close(warp(logits, temperature=2.0), logits / 2)


def test_min_new_tokens_suppresses_eos_and_max_new_tokens_bounds_length():
    model = peaked("encoder-decoder")
    ids, mask = source_batch()
    plain = generate(model, ids, mask, max_new_tokens=10).new_tokens()
    assert min(len(t) for t in plain) < 4
    at_least = generate(model, ids, mask, max_new_tokens=10, min_new_tokens=4).new_tokens()
    assert min(len(t) for t in at_least) >= 4
    assert max(len(t) for t in at_least) <= 10


def test_no_repeat_ngram_size_and_suppress_tokens():
    model = peaked("decoder")
    ids, mask = source_batch()
    out = generate(model, ids, mask, max_new_tokens=12, no_repeat_ngram_size=2, eos_token_id=())
    for row, real in zip(out.sequences.tolist(), mask.tolist(), strict=True):
        seq = row[len(real) - sum(real) :]  # the prompt is left-padded in the output
        bigrams = list(itertools.pairwise(seq))
        assert len(bigrams) == len(set(bigrams))
    banned = generate(model, ids, mask, max_new_tokens=8, suppress_tokens=[7, 9]).new_tokens()
    assert not {7, 9} & {t for row in banned for t in row}
