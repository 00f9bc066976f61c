"""T5's span corruption: 15% of tokens in spans of mean length 3, each span a sentinel in the
input and the sentinel with the span in the target, so input and target rebuild the text."""

import pytest
import torch

from attnkit import AttnkitError
from attnkit.data.span_corruption import (
    SpanCorruptionDataset,
    noise_mask,
    sentinel_ids,
    sentinel_tokens,
    sentinels_needed,
    span_corruption,
)
from attnkit.tokenizer import Tokenizer

SENTINELS = list(range(1000, 1100))


def rebuild(inputs, targets):
    """The original ids: each input sentinel replaced by what follows it in the target."""
    spans, current = {}, None
    for token in targets:
        if token in SENTINELS:
            current = token
            spans[current] = []
        else:
            spans[current].append(token)
    out = []
    for token in inputs:
        out += spans[token] if token in SENTINELS else [token]
    return out


def test_input_and_target_rebuild_the_sequence():
    g = torch.Generator().manual_seed(0)
    for n in (2, 5, 20, 113):
        ids = list(range(10, 10 + n))
        inputs, targets = span_corruption(ids, SENTINELS, g)
        assert rebuild(inputs, targets) == ids
        assert targets[0] == SENTINELS[0] and targets[-1] in SENTINELS  # opened and closed
        used = [t for t in inputs if t in SENTINELS]
        assert used == SENTINELS[: len(used)]  # in order, one a span


def test_fifteen_percent_in_spans_of_mean_length_three():
    g = torch.Generator().manual_seed(1)
    dropped, spans = 0, 0
    for _ in range(200):
        mask = noise_mask(100, 0.15, 3.0, g)
        assert sum(mask) == 15
        dropped += sum(mask)
        spans += sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
    assert dropped / spans == pytest.approx(3.0)  # round(15 / 3) = 5 spans each time


def test_the_split_is_random_but_seeded():
    def draw(seed):
        return noise_mask(60, 0.15, 3.0, torch.Generator().manual_seed(seed))

    assert draw(3) == draw(3) and draw(3) != draw(4)


def test_too_few_sentinels_or_tokens_are_refused_in_one_sentence():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(AttnkitError, match="more spans than the 2 sentinels"):
        span_corruption(list(range(200)), [1000, 1001], g)
    with pytest.raises(AttnkitError, match="at least 2 tokens"):
        span_corruption([5], SENTINELS, g)


def corrupted_sentences(tmp_path, **options):
    """A SpanCorruptionDataset of 40 sentences of 3 to 42 words over a word tokenizer."""
    words = [f"w{i}" for i in range(30)]
    sentences = [" ".join(words[(i + j) % 30] for j in range(3 + i)) for i in range(40)]
    tokenizer = Tokenizer.train(
        "word", texts=sentences, vocab_size=64, extra_specials=sentinel_tokens(6)
    )
    sentinels = sentinel_ids(tokenizer, sentinels_needed(44, 0.15, 3.0))
    dataset = SpanCorruptionDataset(
        sentences, tokenizer, sentinels=sentinels, max_len=44, **options
    )
    return dataset, tokenizer, sentences


def test_the_dataset_gives_pairs_that_rebuild_each_sentence(tmp_path):
    dataset, tokenizer, sentences = corrupted_sentences(tmp_path)
    for i in range(len(dataset)):
        src, tgt = dataset[i]
        assert src[-1] == tokenizer.eos_id and (tgt[0], tgt[-1]) == (tokenizer.bos_id, 2)
        # The sampler batches by lengths known before the draw: they are the drawn ones.
        assert [len(src), len(tgt)] == dataset.lengths[i].tolist()
        sentinels = set(dataset.sentinels)
        spans, current = {}, None
        for token in tgt[1:-1].tolist():
            if token in sentinels:
                current = spans.setdefault(token, [])
            else:
                current.append(token)
        ids = [t for token in src[:-1].tolist() for t in spans.get(token, [token])]
        assert tokenizer.decode(ids) == sentences[i]


def test_each_epoch_corrupts_afresh_and_the_same_epoch_alike(tmp_path):
    dataset, _, _ = corrupted_sentences(tmp_path, seed=3)
    first = [dataset[i][0].tolist() for i in range(len(dataset))]
    assert [dataset[i][0].tolist() for i in range(len(dataset))] == first
    dataset.set_epoch(1)
    second = [dataset[i][0].tolist() for i in range(len(dataset))]
    assert second != first
    dataset.set_epoch(0)  # a resumed run reads again what epoch 0 read
    assert [dataset[i][0].tolist() for i in range(len(dataset))] == first


def test_the_sentinels_are_specials_after_the_five(tmp_path):
    _, tokenizer, _ = corrupted_sentences(tmp_path)
    assert sentinel_ids(tokenizer, 3) == [5, 6, 7]
    assert tokenizer.id_to_token(5) == "<extra_id_0>"
    assert tokenizer.decode([5, 10, 6]) == tokenizer.decode([10])  # skipped as specials
    with pytest.raises(AttnkitError, match="has no <extra_id_6>"):
        sentinel_ids(tokenizer, 7)


def test_enough_sentinels_for_the_longest_sentence():
    g = torch.Generator().manual_seed(0)
    for max_len in (2, 10, 64, 128):
        count = sentinels_needed(max_len, 0.15, 3.0)
        for n in range(2, max_len + 1):
            span_corruption(list(range(n)), SENTINELS[:count], g)  # never runs out
    assert sentinels_needed(128, 0.15, 3.0) == 7  # round(19 / 3) = 6 spans and the closing one
