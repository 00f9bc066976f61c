import math

import pytest
import sacrebleu
import torch

from attnkit.data.batch import Batch, pad
from attnkit.errors import AttnkitError
from attnkit.generation import GenerateOutput, generate
from attnkit.models import build_model
from attnkit.run import with_decoding_ids
from attnkit.tokenizer import Tokenizer
from attnkit.train import sequence_level as sl
from attnkit.train.objectives import LanguageModelObjective, TranslationObjective
from attnkit.train.run_config import RunConfig
from attnkit.train.sequence_level import (
    SequenceLevel,
    SequenceLossSection,
    first_occurrences,
    leave_one_out,
    policy_gradient_loss,
    risk,
)
from tests.helpers import RUN_LINES, tiny_config

QUIET = {"dropout": 0.0, "embedding_dropout": 0.0}
SOURCES = ["ein hund läuft", "zwei kinder"]
REFERENCES = ["a dog runs", "the cat sleeps"]
# Per source: its reference, a part of it, another sentence, and a repeat of the part.
CANDIDATES = [
    ["a dog runs", "a dog", "the cat", "a dog"],
    ["the cat sleeps", "the", "a dog", "the"],
]
GREEDY = ["a dog", "the cat"]


def model_and_tokenizer(shape: str = "encoder-decoder", **changes):
    tokenizer = Tokenizer.train("char", texts=RUN_LINES * 3)
    config = tiny_config(shape, 1, vocab_size=tokenizer.vocab_size, max_len=40, **changes)
    torch.manual_seed(0)
    return build_model(with_decoding_ids(config, tokenizer)).train(), tokenizer


def translation_batch(tokenizer: Tokenizer) -> Batch:
    src = tokenizer.encode_batch(SOURCES)
    tgt = tokenizer.encode_batch(REFERENCES, add_bos=True, add_eos=True)
    return Batch(*pad(src, tokenizer.pad_id), *pad(tgt, tokenizer.pad_id))


def candidate_rows(tokenizer: Tokenizer, k: int) -> list[list[int]]:
    t = tokenizer
    return [[t.bos_id, *t.encode(text), t.eos_id] for group in CANDIDATES for text in group[:k]]


def fixed(tokenizer: Tokenizer, k: int):
    """`SequenceLevel.candidates` replaced by the CANDIDATES, padded after their EOS."""
    ids, _ = pad(candidate_rows(tokenizer, k), tokenizer.pad_id)
    return lambda model, prompts: GenerateOutput(ids, None, 1, (tokenizer.eos_id,))


def hand_log_probs(model, batch: Batch, rows: list[list[int]], k: int) -> torch.Tensor:
    """log p(y | x) of each row, one unpadded sequence at a time: (sources, k)."""
    out = []
    for i, row in enumerate(rows):
        src = batch.src[i // k, : int(batch.src_mask[i // k].sum())][None]
        logp = model(src, torch.tensor([row[:-1]])).logits[0].log_softmax(-1)
        out.append(sum(logp[t, row[t + 1]] for t in range(len(row) - 1)))
    return torch.stack(out).view(-1, k)


def sentence_bleu(hypotheses: list[str], k: int) -> torch.Tensor:
    refs = [r for r in REFERENCES for _ in range(k)]
    scores = [
        sacrebleu.sentence_bleu(h, [r]).score / 100 for h, r in zip(hypotheses, refs, strict=True)
    ]
    return torch.tensor(scores, dtype=torch.float64).view(-1, k)


def gradients(model, loss: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def objective_loss(model, tokenizer, monkeypatch, **settings):
    section = SequenceLossSection(mle_weight=0.0, **settings)
    objective = SequenceLevel(TranslationObjective(), section, tokenizer)
    monkeypatch.setattr(objective, "candidates", fixed(tokenizer, section.candidates))
    # The greedy translations of self-critical's baseline: parts of the references.
    t = tokenizer
    greedy, _ = pad([[t.bos_id, *t.encode(text), t.eos_id] for text in GREEDY], t.pad_id)
    output = GenerateOutput(greedy, None, 1, (t.eos_id,))
    monkeypatch.setattr(objective, "decode", lambda model, prompts, options: output)
    terms = objective(model, translation_batch(tokenizer))
    return terms, terms.total / terms.tokens


def test_self_critical_gradient_is_the_hand_computed_one(monkeypatch):
    model, tokenizer = model_and_tokenizer(**QUIET)
    batch = translation_batch(tokenizer)
    terms, loss = objective_loss(model, tokenizer, monkeypatch, kind="self-critical")
    ours = gradients(model, loss)

    k = 4
    rewards = sentence_bleu([t for g in CANDIDATES for t in g[:k]], k)
    baseline = sentence_bleu(GREEDY, 1)
    assert (baseline > 0).all() and (rewards > baseline).any() and (rewards < baseline).any()
    logp = hand_log_probs(model, batch, candidate_rows(tokenizer, k), k)
    expected = -((rewards - baseline).float() * logp).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    for got, want in zip(ours, gradients(model, expected), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert float(terms.reward) == pytest.approx(float(rewards.mean(-1).sum()))
    assert float(terms.sources) == 2


def test_leave_one_out_reinforce_is_its_definition(monkeypatch):
    model, tokenizer = model_and_tokenizer(**QUIET)
    batch = translation_batch(tokenizer)
    _, loss = objective_loss(model, tokenizer, monkeypatch, kind="reinforce", candidates=3)
    rewards = sentence_bleu([t for g in CANDIDATES for t in g[:3]], 3)
    logp = hand_log_probs(model, batch, candidate_rows(tokenizer, 3), 3)
    baseline = torch.stack(
        [(rewards.sum(-1) - rewards[:, j]) / 2 for j in range(3)], -1
    )  # the other two
    expected = -((rewards - baseline).float() * logp).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    for got, want in zip(gradients(model, loss), gradients(model, expected), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_minimum_risk_is_its_definition(monkeypatch):
    model, tokenizer = model_and_tokenizer(**QUIET)
    batch = translation_batch(tokenizer)
    alpha = 0.5
    _, loss = objective_loss(model, tokenizer, monkeypatch, kind="risk", alpha=alpha)
    rewards = sentence_bleu([t for g in CANDIDATES for t in g], 4)
    logp = hand_log_probs(model, batch, candidate_rows(tokenizer, 4), 4)
    expected = 0
    for i in range(2):
        distinct = [0, 1, 2]  # the fourth candidate repeats the second
        weights = torch.stack([torch.exp(alpha * logp[i, j]) for j in distinct])
        q = weights / weights.sum()
        expected = expected + sum(q[n] * (1 - rewards[i, j]) for n, j in enumerate(distinct))
    expected = expected / 2
    torch.testing.assert_close(loss, expected.float(), rtol=1e-5, atol=1e-6)
    for got, want in zip(gradients(model, loss), gradients(model, expected), strict=True):
        torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-6)


def test_the_cross_entropy_is_mixed_in_by_its_weight(monkeypatch):
    model, tokenizer = model_and_tokenizer(**QUIET)
    batch = translation_batch(tokenizer)
    weight = 0.4
    section = SequenceLossSection(kind="risk", mle_weight=weight)
    objective = SequenceLevel(TranslationObjective(0.1), section, tokenizer)
    monkeypatch.setattr(objective, "candidates", fixed(tokenizer, 4))
    terms = objective(model, batch)
    plain = TranslationObjective(0.1)(model, batch)
    _, sequence = objective_loss(model, tokenizer, monkeypatch, kind="risk")
    torch.testing.assert_close(terms.loss, plain.loss)  # reported: the cross-entropy
    expected = weight * plain.loss / plain.tokens + (1 - weight) * sequence
    torch.testing.assert_close(terms.total / terms.tokens, expected, rtol=1e-5, atol=1e-6)


def test_candidates_are_decoded_by_generate_on_the_cache_without_dropout(monkeypatch):
    model, tokenizer = model_and_tokenizer(dropout=0.3)
    seen = []

    def spy(model, *args, **options):
        seen.append((model.training, args[2].use_cache, args[2].num_return_sequences))
        return generate(model, *args, **options)

    monkeypatch.setattr(sl, "generate", spy)
    section = SequenceLossSection(kind="self-critical", candidates=3)
    objective = SequenceLevel(TranslationObjective(), section, tokenizer)
    terms = objective(model, translation_batch(tokenizer))
    assert seen == [(False, True, 3), (False, True, 1)]  # the samples, then greedy
    assert model.training and terms.total.requires_grad
    assert 0 <= float(terms.reward) / float(terms.sources) <= 1


def test_beam_candidates_for_minimum_risk(monkeypatch):
    model, tokenizer = model_and_tokenizer(**QUIET)
    section = SequenceLossSection(kind="risk", candidates=3, search="beam")
    objective = SequenceLevel(TranslationObjective(), section, tokenizer)
    batch = translation_batch(tokenizer)
    outputs = objective.candidates(model, objective.prompts(batch, model.config.max_len))
    assert outputs.sequences.shape[0] == 6 and outputs.sequences_scores is not None
    assert objective(model, batch).total.requires_grad


def test_language_model_continuations_are_scored_after_the_prompt(monkeypatch):
    model, tokenizer = model_and_tokenizer("decoder", **QUIET, tie_embeddings="decoder")
    block = torch.tensor(
        [tokenizer.encode("a dog runs")[:8], tokenizer.encode("the cat sleeps")[:8]]
    )
    batch = Batch(tgt=block)
    section = SequenceLossSection(
        kind="reinforce", candidates=2, prompt_fraction=0.5, temperature=2.0
    )
    objective = SequenceLevel(LanguageModelObjective(), section, tokenizer)
    prompts = objective.prompts(batch, model.config.max_len)
    references = tokenizer.decode_batch(block[:, 4:].tolist())
    assert torch.equal(prompts.inputs, block[:, :4]) and prompts.references == references
    assert prompts.max_new_tokens == 4 and prompts.eos == ()
    outputs = objective.candidates(model, prompts)
    assert outputs.sequences.shape == (4, 8) and torch.equal(
        outputs.sequences[::2, :4], block[:, :4]
    )
    got = objective.log_probs(model, prompts, batch, outputs)
    # Scored under the policy they were sampled from: softmax(z / temperature).
    logp = (model(outputs.sequences[:, :-1]).logits / 2.0).log_softmax(-1)
    picked = logp.gather(-1, outputs.sequences[:, 1:, None])[..., 0]
    torch.testing.assert_close(got, picked[:, 3:].sum(-1))  # the four generated tokens only
    assert objective(model, batch).total.requires_grad


def test_a_padded_prompt_is_scored_as_if_alone():
    """A short last block: its prompt holds padding, which generate moves to the left."""
    model, tokenizer = model_and_tokenizer("decoder", **QUIET, tie_embeddings="decoder")
    rows = [tokenizer.encode("a dog runs")[:8], tokenizer.encode("the")[:3]]
    block, mask = pad(rows, tokenizer.pad_id)
    section = SequenceLossSection(kind="reinforce", candidates=2)
    objective = SequenceLevel(LanguageModelObjective(), section, tokenizer)
    batch = Batch(tgt=block, tgt_mask=mask)
    prompts = objective.prompts(batch, model.config.max_len)
    outputs = objective.candidates(model, prompts)
    got = objective.log_probs(model, prompts, batch, outputs)
    for i, row in enumerate(outputs.sequences.tolist()):
        prompt = rows[i // 2][:4]  # the real tokens of its prompt
        generated = row[outputs.prefix_length :]
        ids = torch.tensor([prompt + generated[:-1]])
        logp = model(ids).logits[0].log_softmax(-1)
        n = len(prompt)
        want = sum(logp[n - 1 + j, t] for j, t in enumerate(generated))
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-5)


def test_evaluation_is_the_cross_entropy(monkeypatch):
    model, tokenizer = model_and_tokenizer()
    model.eval()
    batch = translation_batch(tokenizer)
    objective = SequenceLevel(TranslationObjective(), SequenceLossSection(kind="risk"), tokenizer)
    monkeypatch.setattr(objective, "candidates", lambda *a: pytest.fail("decoded in evaluation"))
    terms = objective(model, batch)
    assert terms.sequence is None and torch.equal(
        terms.nll, TranslationObjective()(model, batch).nll
    )


def test_pieces_are_their_definitions():
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    rewards = torch.tensor([[0.5, 0.2, 0.8]], dtype=torch.float64)
    baseline = leave_one_out(rewards)
    torch.testing.assert_close(baseline, torch.tensor([[0.5, 0.65, 0.35]], dtype=torch.float64))
    pg = policy_gradient_loss(logp, rewards, baseline)
    torch.testing.assert_close(pg, torch.tensor([-(0.0 * -1 + -0.45 * -2 + 0.45 * -3) / 3]))
    distinct = torch.tensor([[True, False, True]])
    w = [math.exp(0.1 * -1.0), math.exp(0.1 * -3.0)]
    expected = (w[0] * 0.5 + w[1] * 0.2) / sum(w)
    torch.testing.assert_close(risk(logp, rewards, 0.1, distinct), torch.tensor([expected]))
    rows = [[5, 6], [5], [5, 6], [7], [7], [8]]
    assert first_occurrences(rows, 3).tolist() == [[True, True, False], [True, False, True]]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kind": "reinforce", "candidates": 1}, "needs sequence_loss.candidates >= 2"),
        ({"kind": "self-critical", "search": "beam"}, "needs sequence_loss.kind 'risk'"),
        ({"kind": "risk", "mle_weight": 1.0}, "sequence_loss.mle_weight"),
        ({"kind": "mrt"}, "risk"),
        ({"reward": "ter"}, "bleu"),
    ],
)
def test_bad_settings_stop_in_one_sentence(values, message):
    with pytest.raises(AttnkitError, match=message):
        RunConfig.from_dict({"sequence_loss": values})


def test_the_section_defaults_to_the_cross_entropy():
    assert not RunConfig().sequence_loss.on
