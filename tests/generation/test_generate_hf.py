"""Token-for-token agreement with Hugging Face `generate` on twin models with copied weights."""

import pytest
import torch

pytest.importorskip("transformers")

from attnkit.generation import generate
from bench.peers.hf_models import before_eos, bloom_twins, gpt2_twins, marian_twins, mistral_twins

EOS = 2
OPTIONS = [
    {},
    {"num_beams": 4},
    {"num_beams": 4, "num_return_sequences": 3, "length_penalty": 0.6},
    {"num_beams": 3, "early_stopping": True},
    {"num_beams": 4, "early_stopping": "never", "length_penalty": 2.0},
    {"num_beams": 5, "no_repeat_ngram_size": 2, "repetition_penalty": 1.5, "min_new_tokens": 2},
]


def boost_eos(*embeddings: torch.Tensor) -> None:
    """Make EOS likely on random weights (tied heads), so hypotheses finish at different steps."""
    with torch.no_grad():
        for weight in embeddings:
            weight[EOS] *= 4.0


def exercises_eos(generated: torch.Tensor, options: dict) -> bool:
    """Some hypothesis ended with EOS (a length penalty of 2 may rightly prefer none)."""
    return options.get("length_penalty", 1.0) > 1.0 or bool((generated == EOS).any())


@pytest.fixture(scope="module")
def gpt2():
    ours, hf = gpt2_twins(2, 32, 4, 30, 64, seed=1)
    boost_eos(ours.embed.token.weight, hf.transformer.wte.weight)
    return ours, hf


@pytest.fixture(scope="module")
def mistral():
    """RoPE, RMSNorm, SwiGLU, grouped-query attention and a window of 4 over 18 positions."""
    ours, hf = mistral_twins(2, 32, 4, 30, 64, sliding_window=4, seed=1)
    boost_eos(ours.embed.token.weight, hf.model.embed_tokens.weight)
    return ours, hf


@pytest.fixture(scope="module")
def bloom():
    """ALiBi over six heads (slopes of a number of heads that is not a power of two)."""
    ours, hf = bloom_twins(2, 36, 6, 30, seed=1)
    boost_eos(ours.embed.token.weight, hf.transformer.word_embeddings.weight)
    return ours, hf


@pytest.fixture(scope="module")
def marian():
    ours, hf = marian_twins(2, 32, 4, 30, 64, seed=1)
    boost_eos(ours.src_embed.token.weight, hf.model.shared.weight)
    return ours, hf


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("family", ["gpt2", "mistral", "bloom"])
def test_left_padded_prompts_match_transformers(family, options, request):
    ours, hf = request.getfixturevalue(family)
    torch.manual_seed(5)
    ids = torch.randint(3, 30, (4, 6))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :4] = 0
    ids = ids.masked_fill(mask == 0, 0)
    mine = generate(ours, ids, mask, max_new_tokens=12, eos_token_id=EOS, pad_token_id=0, **options)
    theirs = hf.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=12,
        eos_token_id=EOS,
        pad_token_id=0,
        do_sample=False,
        **options,
    )
    assert before_eos(mine.sequences.tolist(), EOS) == before_eos(theirs.tolist(), EOS)
    assert exercises_eos(mine.sequences[:, 6:], options)


# Real Marian checkpoints force EOS at the last step and never generate their pad id.
MARIAN_CHECKPOINT_OPTIONS = {"forced_eos_token_id": EOS, "suppress_tokens": [0]}


@pytest.mark.parametrize(
    "options",
    [*OPTIONS, MARIAN_CHECKPOINT_OPTIONS, {"num_beams": 4, **MARIAN_CHECKPOINT_OPTIONS}],
)
def test_marian_translation_matches_transformers(marian, options):
    ours, hf = marian
    torch.manual_seed(6)
    src = torch.randint(3, 30, (4, 7))
    mask = torch.ones_like(src)
    mask[1, 5:] = 0
    mask[3, 3:] = 0
    src = src.masked_fill(mask == 0, 0)
    mine = generate(
        ours, src, mask, max_new_tokens=10, decoder_start_token_id=0, pad_token_id=0, **options
    )
    theirs = hf.generate(src, attention_mask=mask, max_new_tokens=10, do_sample=False, **options)
    assert before_eos(mine.sequences.tolist(), EOS) == before_eos(theirs.tolist(), EOS)
    assert exercises_eos(mine.sequences, options)
