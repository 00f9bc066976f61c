"""Decoding strategies: greedy, beam search, sampling, streaming, and their options."""

import itertools

import pytest
import torch

from attnkit import AttnkitError, ModelConfig, build_model
from attnkit.data.batch import pad
from attnkit.generate import GenerationConfig, beam_search, generate, stream, warp
from tests.nn.test_kv_cache import padded_batch, tiny


def peaked(shape: str, vocab_size: int = 40, scale: float = 4.0, seed: int = 1):
    """A random model whose next-token distributions are far from uniform, EOS included."""
    torch.manual_seed(seed)
    extra = {"n_encoder_layers": 1} if shape == "encoder-decoder" else {}
    model = build_model(
        ModelConfig(
            shape=shape,
            vocab_size=vocab_size,
            d_model=16,
            n_heads=2,
            d_ff=32,
            n_decoder_layers=1,
            dropout=0.0,
            embedding_dropout=0.0,
            max_len=32,
            tie_embeddings="none",
            **extra,
        )
    ).eval()
    with torch.no_grad():
        model.head.weight.mul_(scale)
        model.head.weight[2].mul_(1.5)  # EOS (id 2) within reach
    return model


def source_batch():
    torch.manual_seed(1)
    return padded_batch([7, 4, 2, 5], 7)


@pytest.mark.parametrize("shape", ["encoder-decoder", "decoder"])
def test_beam_search_with_one_beam_is_greedy(shape):
    model = peaked(shape)
    ids, mask = source_batch()
    greedy = generate(model, ids, mask, max_new_tokens=10)
    beam = beam_search(model, ids, mask, max_new_tokens=10, num_beams=1)
    assert beam.new_tokens() == greedy.new_tokens()
    assert any(len(t) < 10 for t in greedy.new_tokens())  # EOS was reached somewhere


@pytest.mark.parametrize("shape", ["encoder-decoder", "decoder"])
def test_top_k_one_sampling_is_greedy(shape):
    model = peaked(shape)
    ids, mask = source_batch()
    greedy = generate(model, ids, mask, max_new_tokens=8)
    sampled = generate(model, ids, mask, max_new_tokens=8, do_sample=True, top_k=1, seed=5)
    assert torch.equal(sampled.sequences, greedy.sequences)


def test_same_seed_same_samples_and_other_seed_other_samples():
    model = peaked("decoder", scale=1.0)
    ids, mask = source_batch()
    options = {"max_new_tokens": 12, "do_sample": True, "temperature": 1.5, "top_p": 0.95}
    a = generate(model, ids, mask, seed=3, **options).sequences
    b = generate(model, ids, mask, seed=3, **options).sequences
    c = generate(model, ids, mask, seed=4, **options).sequences
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


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


@torch.no_grad()
def test_beam_search_finds_the_best_sequence_when_beams_cover_every_prefix():
    """Vocabulary 5, 3 new tokens: all 85 sequences are scored by teacher forcing.

    On this model and these sources two beams miss the best sequence at every
    length penalty tried, so the test tells an exhaustive search from a narrow one.
    """
    torch.manual_seed(2)
    config = ModelConfig(
        vocab_size=5,
        d_model=64,
        n_heads=4,
        d_ff=128,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.0,
        embedding_dropout=0.0,
        max_len=16,
        tie_embeddings="none",
        norm_position="pre",
    )
    model = build_model(config).eval()
    with torch.no_grad():
        model.head.weight.mul_(2.0)
    src = torch.tensor([[3, 4, 3, 1], [4, 4, 1, 3], [1, 3, 4, 0]])
    eos, steps = 2, 3
    others = [t for t in range(5) if t != eos]
    candidates = [
        [*prefix, eos] for n in range(steps) for prefix in itertools.product(others, repeat=n)
    ] + [list(p) for p in itertools.product(others, repeat=steps)]
    tgt, tgt_mask = pad([[1, *seq] for seq in candidates], 0)
    lengths = torch.tensor([len(seq) for seq in candidates])
    for row in range(src.shape[0]):
        sources = src[row : row + 1].expand(len(candidates), -1)
        log_probs = model(sources, tgt[:, :-1], tgt_mask=tgt_mask[:, :-1]).logits.log_softmax(-1)
        token_log_probs = log_probs.gather(2, tgt[:, 1:, None])[..., 0] * tgt_mask[:, 1:]
        totals = token_log_probs.sum(1)
        for length_penalty in (0.0, 1.0, 2.0):
            out = generate(
                model,
                src[row : row + 1],
                max_new_tokens=steps,
                num_beams=80,
                length_penalty=length_penalty,
                early_stopping="never",
            )
            scores = totals / lengths.double() ** length_penalty
            best = int(scores.argmax())
            assert out.sequences[0, 1 : 1 + lengths[best]].tolist() == candidates[best]
            assert out.sequences_scores[0].item() == pytest.approx(scores[best].item(), abs=1e-5)


@pytest.mark.parametrize("shape", ["encoder-decoder", "decoder"])
def test_cached_and_uncached_beam_search_agree(shape):
    model = peaked(shape)
    ids, mask = source_batch()
    options = {"max_new_tokens": 9, "num_beams": 3, "num_return_sequences": 2}
    cached = generate(model, ids, mask, **options)
    uncached = generate(model, ids, mask, use_cache=False, **options)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores)


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("shape", ["encoder-decoder", "decoder"])
def test_padding_never_leaks_into_results(shape, num_beams):
    """Each input decoded alone equals it decoded in a padded batch (left or right padding)."""
    model = peaked(shape)
    ids, mask = source_batch()
    batched = generate(model, ids, mask, max_new_tokens=8, num_beams=num_beams).new_tokens()
    for row in range(ids.shape[0]):
        alone = ids[row : row + 1, : int(mask[row].sum())]
        assert generate(model, alone, max_new_tokens=8, num_beams=num_beams).new_tokens() == [
            batched[row]
        ]


def test_stream_yields_the_greedy_tokens_one_step_at_a_time():
    model = peaked("decoder")
    ids, mask = source_batch()
    steps = list(stream(model, ids, mask, max_new_tokens=6))
    greedy = generate(model, ids, mask, max_new_tokens=6)
    assert torch.equal(torch.stack(steps, 1), greedy.sequences[:, greedy.prefix_length :])


@pytest.mark.parametrize("use_cache", [True, False])
@torch.no_grad()
def test_decoding_past_max_len_conditions_on_the_last_max_len_tokens(use_cache):
    model = peaked("decoder")  # max_len 32
    ids, mask = source_batch()
    out = generate(model, ids, mask, max_new_tokens=40, eos_token_id=None, use_cache=use_cache)
    assert out.sequences.shape[1] == 7 + 40
    for row, n in enumerate(mask.sum(1).tolist()):
        # nanoGPT's loop: crop to the last max_len tokens, run them all, take the argmax.
        seq = ids[row : row + 1, :n]
        for _ in range(40):
            logits = model(seq[:, -32:]).logits[:, -1]
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], 1)
        assert out.sequences[row, -40:].tolist() == seq[0, n:].tolist()
    stopped = generate(model, ids, mask, max_new_tokens=40, crop_context=False)
    assert stopped.sequences.shape[1] <= 32


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
    out = generate(model, ids, mask, max_new_tokens=12, no_repeat_ngram_size=2, eos_token_id=None)
    for row, real in zip(out.sequences.tolist(), mask.tolist(), strict=True):
        seq = row[len(real) - sum(real) :]  # the prompt is left-padded in the output
        bigrams = list(itertools.pairwise(seq))
        assert len(bigrams) == len(set(bigrams))
    banned = generate(model, ids, mask, max_new_tokens=8, suppress_tokens=[7, 9]).new_tokens()
    assert not {7, 9} & {t for row in banned for t in row}


def test_n_best_lists_are_sorted_and_distinct():
    model = peaked("encoder-decoder")
    ids, mask = source_batch()
    out = generate(model, ids, mask, max_new_tokens=8, num_beams=4, num_return_sequences=3)
    scores = out.sequences_scores.view(4, 3)
    assert torch.all(scores[:, :-1] >= scores[:, 1:])
    tokens = out.new_tokens()
    for i in range(4):
        group = [tuple(t) for t in tokens[3 * i : 3 * i + 3]]
        assert len(set(group)) == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"top_p": 0.0}, "top_p must be in"),
        ({"top_p": 1.5}, "top_p must be in"),
        ({"temperature": 0}, "temperature must be positive"),
        ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences 3 needs"),
        ({"num_beams": 2, "do_sample": True}, "do not combine"),
        ({"early_stopping": "sometimes"}, "early_stopping must be"),
        ({"min_new_tokens": 30, "max_new_tokens": 5}, "min_new_tokens must be"),
        ({"beams": 3}, "no option 'beams'"),
    ],
)
def test_invalid_options_are_one_clear_sentence(options, message):
    model = tiny("decoder")
    with pytest.raises(AttnkitError, match=message):
        generate(model, torch.ones(1, 2, dtype=torch.long), **options)


def test_bad_inputs_are_refused_clearly():
    with pytest.raises(AttnkitError, match="cannot generate"):
        encoder = build_model(
            ModelConfig.from_preset("bert-mini", vocab_size=40, n_encoder_layers=1)
        )
        generate(encoder, torch.ones(1, 2, dtype=torch.long))
    ids, mask = torch.ones(2, 3, dtype=torch.long), torch.tensor([[1, 1, 1], [0, 0, 0]])
    with pytest.raises(AttnkitError, match="row 1 is all padding"):
        generate(tiny("encoder-decoder"), ids, mask)
    with pytest.raises(AttnkitError, match="no room under this model's max_len"):
        generate(tiny("decoder"), torch.ones(1, 48, dtype=torch.long))
    with pytest.raises(AttnkitError, match="cannot stream"):
        next(stream(tiny("decoder"), torch.ones(1, 2, dtype=torch.long), num_beams=2))


def test_generation_config_can_be_reused_with_overrides():
    model = peaked("decoder")
    ids, mask = source_batch()
    config = GenerationConfig(max_new_tokens=5, num_beams=2)
    a = generate(model, ids, mask, config)
    b = generate(model, ids, mask, config, num_beams=1)
    assert a.sequences_scores is not None and b.sequences_scores is None
