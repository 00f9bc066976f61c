import math
from itertools import pairwise

import pytest
import torch

from attnkit.data.batch import Batch, pad
from attnkit.errors import AttnkitError
from attnkit.train import scheduled_sampling as ss
from attnkit.train.objectives import LanguageModelObjective, TranslationObjective
from attnkit.train.run_config import RunConfig
from attnkit.train.scheduled_sampling import (
    ScheduledSampling,
    ScheduledSamplingSection,
    SoftInputs,
    choose_positions,
    gold_probability,
    mix_inputs,
)
from tests.helpers import tiny_model, translation_batches

QUIET = {"dropout": 0.0, "embedding_dropout": 0.0}


def section(**values) -> ScheduledSamplingSection:
    return ScheduledSamplingSection(**values)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"decay": "off"}, lambda i: 1.0),
        ({"decay": "constant", "k": 0.7}, lambda i: 0.7),
        ({"decay": "linear", "k": 1.0, "slope": 1e-3}, lambda i: max(0.0, 1.0 - 1e-3 * i)),
        (
            {"decay": "linear", "k": 0.9, "slope": 1e-3, "min_gold": 0.5},
            lambda i: max(0.5, 0.9 - 1e-3 * i),
        ),
        ({"decay": "exponential", "k": 0.999}, lambda i: 0.999**i),
        ({"decay": "inverse-sigmoid", "k": 100.0}, lambda i: 100 / (100 + math.exp(i / 100))),
    ],
)
def test_gold_probability_follows_its_schedule(values, expected):
    schedule = section(**values)
    steps = [0, 1, 10, 250, 400, 999, 5000, 60000]
    got = [gold_probability(schedule, i) for i in steps]
    assert got == pytest.approx([expected(i) for i in steps], abs=1e-12)
    assert all(b <= a for a, b in pairwise(got))  # never rises


def test_positions_are_chosen_at_the_rate_of_the_schedule():
    torch.manual_seed(0)
    mask = torch.ones(200, 50, dtype=torch.bool)
    mask[:, 40:] = False
    chosen = choose_positions(mask, mask.shape, gold=0.75, device=torch.device("cpu"))
    assert not chosen[:, 0].any() and not chosen[:, 40:].any()
    assert chosen[:, 1:40].float().mean() == pytest.approx(0.25, abs=0.01)
    assert not choose_positions(mask, mask.shape, 1.0, torch.device("cpu")).any()


def test_mixed_inputs_hold_the_prediction_of_each_chosen_position():
    gold = torch.tensor([[1, 10, 11, 12, 13]])
    predicted = torch.tensor([[20, 21, 22, 23, 24]])  # row t predicts token t + 1
    chosen = torch.tensor([[False, True, False, True, False]])
    assert mix_inputs(gold, predicted, chosen).tolist() == [[1, 20, 11, 22, 13]]


def spy_on(objective, monkeypatch):
    """Record the decoder inputs of each pass and the positions chosen for mixing."""
    runs, chosen = [], []
    run = objective.base.run

    def recording_run(model, batch, dec_in, dec_mask):
        runs.append(dec_in.clone())
        return run(model, batch, dec_in, dec_mask)

    def recording_choice(*args):
        chosen.append(choose(*args))
        return chosen[-1]

    choose = ss.choose_positions
    monkeypatch.setattr(objective.base, "run", recording_run)
    monkeypatch.setattr(ss, "choose_positions", recording_choice)
    return runs, chosen


def test_second_pass_reads_argmax_predictions_exactly_where_chosen(monkeypatch):
    model = tiny_model(**QUIET).train()
    batch = translation_batches(1, batch_size=6)[0]
    objective = ScheduledSampling(TranslationObjective(), section(decay="constant", k=0.5))
    runs, chosen = spy_on(objective, monkeypatch)
    objective(model, batch)
    assert len(runs) == 2 and len(chosen) == 1
    gold, mixed = runs
    with torch.no_grad():
        first = model(batch.src, gold, batch.src_mask, batch.tgt_mask[:, :-1]).logits
    expected = mix_inputs(gold, first.argmax(-1), chosen[0])
    assert torch.equal(mixed, expected)
    assert torch.equal(mixed != gold, chosen[0] & (mixed != gold))  # changed only where chosen
    assert 0 < int(chosen[0].sum()) < int(batch.tgt_mask[:, 1:-1].sum())


def test_gold_probability_one_is_teacher_forcing_exactly():
    """No position is chosen: the second pass reads the gold prefix and gives its loss."""
    batch = translation_batches(1, batch_size=6)[0]
    torch.manual_seed(0)
    plain = TranslationObjective(0.1)(tiny_model(**QUIET).train(), batch)
    for mix in ("argmax", "softmax"):
        # k just under 1 runs both passes; no draw in [0, 1) reaches it in float32.
        wrapped = ScheduledSampling(
            TranslationObjective(0.1), section(decay="constant", k=1 - 1e-9, mix=mix)
        )
        terms = wrapped(tiny_model(**QUIET).train(), batch)
        assert torch.equal(terms.loss, plain.loss), mix
        assert torch.equal(terms.tokens, plain.tokens)


def test_evaluation_is_teacher_forcing(monkeypatch):
    model = tiny_model().eval()
    batch = translation_batches(1)[0]
    objective = ScheduledSampling(TranslationObjective(), section(decay="constant", k=0.0))
    runs, _ = spy_on(objective, monkeypatch)
    assert torch.equal(objective(model, batch).loss, TranslationObjective()(model, batch).loss)
    assert len(runs) == 1


def test_soft_inputs_are_expected_embeddings():
    torch.manual_seed(0)
    model = tiny_model(**QUIET)
    token = model.tgt_embed.token
    logits = torch.randn(2, 4, token.vocab_size)
    chosen = torch.tensor([[False, True, True, False], [False, True, False, True]])
    previous = torch.cat([logits[:, :1], logits[:, :-1]], 1)  # the prediction of position t
    whole = SoftInputs(logits, chosen, 0).embed(token)
    torch.testing.assert_close(whole, (previous.softmax(-1) @ token.weight * token.scale)[chosen])
    top = SoftInputs(logits, chosen, 3).embed(token)
    values, ids = previous.topk(3, -1)
    expected = torch.einsum("btk,btkd->btd", values.softmax(-1), token.weight[ids]) * token.scale
    torch.testing.assert_close(top, expected[chosen])


def test_soft_inputs_replace_only_the_decoder_lookup():
    """With tied embeddings the encoder reads the same table; its lookups stay hard."""
    model = tiny_model(**QUIET, tie_embeddings="all")
    token = model.tgt_embed.token
    assert model.src_embed.token is token
    ids = torch.tensor([[1, 5, 6]])
    other = ids.clone()
    chosen = torch.tensor([[False, True, False]])
    soft = SoftInputs(torch.randn(1, 3, token.vocab_size), chosen, 0)
    with ss._soft_inputs(token, ids, soft):
        replaced, untouched = token(ids), token(other)
    assert torch.equal(untouched, token(other))
    assert torch.equal(replaced[:, [0, 2]], token(ids)[:, [0, 2]])
    torch.testing.assert_close(replaced[0, 1], soft.embed(token)[0])
    assert not torch.equal(replaced[:, 1], token(ids)[:, 1])


@pytest.mark.parametrize("first_pass_grad", [False, True])
def test_softmax_mix_backpropagates_through_the_first_pass_only_if_asked(first_pass_grad):
    batch = translation_batches(1, batch_size=6)[0]
    model = tiny_model(**QUIET).train()
    settings = section(decay="constant", k=0.0, mix="softmax", first_pass_grad=first_pass_grad)
    objective = ScheduledSampling(TranslationObjective(), settings)
    captured = []
    handle = model.decoder.blocks[0].register_forward_hook(
        lambda module, args, out: captured.append(out[0] if isinstance(out, tuple) else out)
    )
    loss = objective(model, batch).loss
    handle.remove()
    first, second = captured
    assert second.requires_grad and first.requires_grad == first_pass_grad
    if first_pass_grad:  # the loss reaches the first pass through the mixed embeddings
        assert torch.autograd.grad(loss, first)[0].abs().sum() > 0


def test_parallel_passes_each_read_the_last_pass(monkeypatch):
    model = tiny_model(**QUIET).train()
    batch = translation_batches(1, batch_size=6)[0]
    objective = ScheduledSampling(
        TranslationObjective(), section(decay="constant", k=0.0, passes=3)
    )
    runs, chosen = spy_on(objective, monkeypatch)
    terms = objective(model, batch)
    assert len(runs) == 4 and len(chosen) == 3 and terms.loss.requires_grad
    real = batch.tgt_mask[:, :-1].clone()
    real[:, 0] = False
    gold, mask = runs[0], batch.tgt_mask[:, :-1]
    for previous, mixed, where in zip(runs, runs[1:], chosen, strict=False):
        assert torch.equal(where, real)  # gold probability 0: each real position after <s>
        with torch.no_grad():
            predicted = model(batch.src, previous, batch.src_mask, mask).logits.argmax(-1)
        assert torch.equal(mixed, mix_inputs(gold, predicted, where))


def test_language_model_trains_with_scheduled_sampling(monkeypatch):
    model = tiny_model("decoder", **QUIET).train()
    ids, mask = pad([[1, 5, 6, 7, 8, 9], [1, 10, 11, 12]], 0)
    objective = ScheduledSampling(LanguageModelObjective(), section(decay="constant", k=0.3))
    runs, chosen = spy_on(objective, monkeypatch)
    terms = objective(model, Batch(tgt=ids, tgt_mask=mask))
    terms.loss.backward()
    assert int(terms.tokens) == 8 and model.head.weight.grad is not None
    gold, mixed = runs
    with torch.no_grad():
        predicted = model(gold, mask[:, :-1]).logits.argmax(-1)
    assert chosen[0].any() and torch.equal(mixed, mix_inputs(gold, predicted, chosen[0]))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"decay": "exponential", "k": 1.0}, "needs 0 < k < 1"),
        ({"decay": "inverse-sigmoid", "k": 0.5}, "needs k >= 1"),
        ({"decay": "linear"}, "needs scheduled_sampling.slope > 0"),
        ({"decay": "constant", "k": 1.5}, "needs 0 <= k <= 1"),
        ({"decay": "constant", "first_pass_grad": True}, "needs scheduled_sampling.mix"),
        ({"decay": "constant", "top_k": 5}, "applies to scheduled_sampling.mix = 'softmax'"),
        ({"decay": "sigmoid"}, "inverse-sigmoid"),
    ],
)
def test_bad_settings_stop_in_one_sentence(values, message):
    with pytest.raises(AttnkitError, match=message):
        RunConfig.from_dict({"scheduled_sampling": values})


def test_the_section_defaults_to_teacher_forcing():
    assert not RunConfig().scheduled_sampling.on
    assert gold_probability(RunConfig().scheduled_sampling, 10**9) == 1.0
    late = gold_probability(section(decay="inverse-sigmoid", k=100.0), 10**9)
    assert late == pytest.approx(0.0, abs=1e-200)  # exp(i / k) would overflow
