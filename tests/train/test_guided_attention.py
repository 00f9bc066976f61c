"""Guided attention (Tachibana et al. 2017): the weight matrix W, the loss L_att, the section,
and the objective that adds weight * L_att to the translation loss in training only."""

import math

import pytest
import torch
from torch.testing import assert_close

from attnkit.cli import main
from attnkit.data.batch import Batch, pad
from attnkit.errors import AttnkitError
from attnkit.run import RunFolder
from attnkit.train import Trainer
from attnkit.train.cross_entropy import IGNORE
from attnkit.train.guided_attention import (
    GuidedAttention,
    GuidedAttentionSection,
    guide_weights,
    guided_attention_loss,
)
from attnkit.train.objectives import TranslationObjective
from attnkit.train.run_config import RunConfig, TrainSection
from attnkit.train.tasks import TaskSetup, _objective
from tests.helpers import tiny_model, translation_batches, translation_config

QUIET = {"dropout": 0.0, "embedding_dropout": 0.0, "attention_dropout": 0.0}


def mask(*lengths: int, width: int | None = None, left: bool = False) -> torch.Tensor:
    """(batch, width) True at each row's `length` real positions, padded on the right (or left)."""
    width = width or max(lengths)
    real = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    return real.flip(-1) if left else real


# -- the weight matrix W ------------------------------------------------------------------------


def test_weights_equal_the_formula_on_a_hand_checked_case():
    # N = T = 2: positions 1/4 and 3/4 on both axes; off the diagonal, |n/N - t/T| = 1/2,
    # 1 - exp(-0.25 / (2 * 0.04)) = 1 - exp(-3.125) = 0.956063.
    w = guide_weights(mask(2), mask(2), 0.2)[0]
    assert_close(w, torch.tensor([[0.0, 0.956063], [0.956063, 0.0]]), atol=1e-6, rtol=0)
    # T = 2 queries at 1/4, 3/4 over N = 4 keys at 1/8, 3/8, 5/8, 7/8: distances 1/8, 3/8, 5/8.
    w = guide_weights(mask(2), mask(4), 0.2)[0]
    near, mid, far = 0.177422, 0.827578, 0.992424
    expected = [[near, near, mid, far], [far, mid, near, near]]
    assert_close(w, torch.tensor(expected), atol=1e-6, rtol=0)
    g = 0.35  # and the formula itself, at another width
    w = guide_weights(mask(3), mask(5), g)[0]
    for t in range(3):
        for n in range(5):
            d = (n + 0.5) / 5 - (t + 0.5) / 3
            assert float(w[t, n]) == pytest.approx(1 - math.exp(-(d**2) / (2 * g**2)), abs=1e-6)


def test_weights_are_zero_on_the_scaled_diagonal_only():
    # N = 3, T = 9: (n + 1/2) / 3 = (t + 1/2) / 9 at t = 3n + 1.
    w = guide_weights(mask(9), mask(3), 0.2)[0]
    diagonal = torch.zeros(9, 3, dtype=torch.bool)
    diagonal[[1, 4, 7], [0, 1, 2]] = True
    assert torch.all(w[diagonal] == 0)
    assert torch.all(w[~diagonal] > 0)
    square = guide_weights(mask(6), mask(6), 0.2)[0]
    assert torch.all(square.diagonal() == 0) and torch.equal(square, square.T)


@pytest.mark.parametrize("left", [False, True])
def test_weights_follow_each_sequences_own_lengths(left):
    queries, keys = mask(4, 2, 3, width=5, left=left), mask(3, 6, 1, width=6, left=left)
    w = guide_weights(queries, keys, 0.2)
    padding = ~(queries[:, :, None] & keys[:, None, :])
    assert torch.all(w[padding] == 0)
    for row, (t, n) in enumerate([(4, 3), (2, 6), (3, 1)]):
        alone = guide_weights(mask(t), mask(n), 0.2)[0]
        assert torch.equal(w[row][queries[row]][:, keys[row]], alone)


# -- the loss L_att -----------------------------------------------------------------------------


def attention_of(scores: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Softmax over the real keys of each row, as cross-attention is."""
    return scores.masked_fill(~keys[:, None, :], float("-inf")).softmax(-1)


def test_padding_is_out_of_the_mean():
    torch.manual_seed(0)
    queries, keys = mask(4, 2, 3, width=5), mask(3, 6, 1, width=6)
    a = attention_of(torch.randn(3, 5, 6), keys)
    loss = guided_attention_loss(a, queries, keys, 0.2)
    alone = [
        guided_attention_loss(a[row : row + 1, :t, :n], mask(t), mask(n), 0.2)
        for row, (t, n) in enumerate([(4, 3), (2, 6), (3, 1)])
    ]
    assert float(loss) == pytest.approx(float(sum(alone) / 3), abs=1e-7)
    # The mean of a pair is over its own N * T cells: the paper's formula, by hand.
    t, n = 4, 3
    by_hand = sum(
        float(a[0, i, j]) * (1 - math.exp(-(((j + 0.5) / n - (i + 0.5) / t) ** 2) / 0.08))
        for i in range(t)
        for j in range(n)
    ) / (n * t)
    assert float(alone[0]) == pytest.approx(by_hand, abs=1e-7)
    # Whatever sits in the padding changes nothing.
    noisy = a + torch.rand_like(a) * ~(queries[:, :, None] & keys[:, None, :])
    assert torch.equal(guided_attention_loss(noisy, queries, keys, 0.2), loss)


def test_a_diagonal_attention_costs_less_than_a_uniform_one():
    queries, keys = mask(6), mask(6)
    diagonal = torch.eye(6)[None]
    uniform = torch.full((1, 6, 6), 1 / 6)
    off = torch.eye(6).flip(-1)[None]  # the anti-diagonal: reading the source backwards
    costs = [float(guided_attention_loss(a, queries, keys, 0.2)) for a in (diagonal, uniform, off)]
    assert costs[0] == 0.0 and costs[0] < costs[1] < costs[2]
    # Heads are averaged: one diagonal head and one uniform head cost their mean.
    both = torch.stack([diagonal, uniform], 1)
    assert float(guided_attention_loss(both, queries, keys, 0.2)) == pytest.approx(costs[1] / 2)


def guided_run(model, batch, layers):
    dec_in, dec_mask, targets = TranslationObjective().teacher_forced(batch)
    out = model(batch.src, dec_in, batch.src_mask, dec_mask, cross_weights=layers)
    return out.attentions["cross"], targets != IGNORE


@pytest.mark.parametrize("guided", [0, 1])
def test_the_gradient_reaches_only_what_the_guided_attention_depends_on(guided):
    model = tiny_model(layers=2, **QUIET).train()
    batch = translation_batches(1)[0]
    (weights,), queries = guided_run(model, batch, [guided])
    loss = guided_attention_loss(weights, queries, batch.src_mask, 0.2)
    assert torch.isfinite(loss) and loss > 0
    loss.backward()
    blocks = model.decoder.blocks
    attn = blocks[guided].cross_attn
    d = attn.n_kv_heads * attn.d_head
    # Its queries and keys decide where it looks; its values and output, and the layers
    # above it, play no part in A.
    assert attn.q_proj.weight.grad.abs().sum() > 0
    assert attn.kv_proj.weight.grad[:d].abs().sum() > 0
    assert torch.all(attn.kv_proj.weight.grad[d:] == 0)
    assert attn.out_proj.weight.grad is None
    unreached = list(blocks[guided + 1 :].parameters())
    unreached += [*blocks[guided].ff.parameters(), *blocks[guided].ff_residual.parameters()]
    assert all(p.grad is None for p in unreached)
    if guided == 1:  # the layer below forms its queries: it learns too
        assert blocks[0].cross_attn.q_proj.weight.grad.abs().sum() > 0
    else:
        assert all(p.grad is None for p in blocks[1].parameters())


def test_training_on_the_loss_makes_attention_diagonal():
    torch.manual_seed(0)
    model = tiny_model(layers=2, **QUIET).train()
    batch = translation_batches(1, batch_size=8)[0]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        (weights,), queries = guided_run(model, batch, [1])
        loss = guided_attention_loss(weights, queries, batch.src_mask, 0.2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]


# -- the section ----------------------------------------------------------------------------------


def test_the_section_is_off_by_default_and_resolves_its_indices():
    s = GuidedAttentionSection()
    assert not s.on and s.width == 0.2
    assert s.layer_indices(3) == (2,) and s.head_indices(4) == (0, 1, 2, 3)
    s = GuidedAttentionSection(weight=1.0, layers="all", heads="0, -1")
    assert s.on and s.layer_indices(3) == (0, 1, 2) and s.head_indices(4) == (0, 3)
    assert GuidedAttentionSection(layers=-2).layer_indices(3) == (1,)
    assert GuidedAttentionSection(layers="2,0").layer_indices(3) == (0, 2)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"weight": -1.0}, "guided_attention.weight must be zero or more, got -1.0"),
        ({"width": 0.0}, "guided_attention.width must be positive, got 0.0"),
        ({"layers": "first"}, "guided_attention.layers must be 'all' or 'last', an index or"),
        ({"heads": "last"}, "guided_attention.heads must be 'all', an index or indices"),
        ({"heads": "0,0"}, "guided_attention.heads names 0 twice; name each index once"),
        ({"weight": math.nan}, "guided_attention.weight must be a finite number, got nan"),
    ],
)
def test_bad_settings_stop_in_one_sentence(values, message):
    with pytest.raises(AttnkitError, match=f"^{message}"):
        GuidedAttentionSection(**values)


def test_indices_out_of_the_models_range_are_refused():
    with pytest.raises(AttnkitError, match=r"^guided_attention.layers 2 is out of range for "):
        GuidedAttentionSection(layers=2).layer_indices(2)
    with pytest.raises(AttnkitError, match=r"model.n_heads = 4; use 0 to 3, or -4 to -1"):
        GuidedAttentionSection(heads="1,-5").head_indices(4)
    with pytest.raises(AttnkitError, match="names index 1 twice"):
        GuidedAttentionSection(layers="1,-1").layer_indices(2)


def test_the_section_reads_from_toml_and_overrides_and_writes_back(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        '[data]\ntask = "translation"\ncorpus = "multi30k"\n'
        '[guided_attention]\nweight = 1\nlayers = "0,1"\n'
    )
    config = RunConfig.load(path, ["guided_attention.heads=1"])
    assert config.guided_attention == GuidedAttentionSection(1.0, 0.2, "0,1", 1)
    again = tmp_path / "again.toml"
    again.write_text(config.to_toml())
    assert RunConfig.load(again).guided_attention == config.guided_attention


# -- the objective ------------------------------------------------------------------------------


def reference_loss(model, batch, layers, heads, width):
    """L_att by the formula, pair by pair, from every attention weight of the model."""
    dec_in, dec_mask, targets = TranslationObjective().teacher_forced(batch)
    with torch.no_grad():
        out = model(batch.src, dec_in, batch.src_mask, dec_mask, need_weights=True)
    cross = out.attentions["cross"]
    total = 0.0
    for row in range(batch.src.shape[0]):
        t, n = int((targets[row] != IGNORE).sum()), int(batch.src_mask[row].sum())
        a = torch.stack([cross[i][row, list(heads), :t, :n] for i in layers]).mean((0, 1))
        cells = [
            float(a[i, j])
            * (1 - math.exp(-(((j + 0.5) / n - (i + 0.5) / t) ** 2) / (2 * width**2)))
            for i in range(t)
            for j in range(n)
        ]
        total += sum(cells) / (n * t)
    return total / batch.src.shape[0]


@pytest.mark.parametrize(
    ("settings", "layers", "heads"),
    [({}, [1], [0, 1]), ({"layers": "all", "heads": 1, "width": 0.3}, [0, 1], [1])],
)
def test_training_adds_weight_times_the_loss_to_the_aux_term(settings, layers, heads):
    batch = translation_batches(1, batch_size=5)[0]
    model = tiny_model(layers=2, **QUIET).train()
    section = GuidedAttentionSection(weight=0.7, **settings)
    guided = GuidedAttention(TranslationObjective(0.1), section)(model, batch)
    plain = TranslationObjective(0.1)(model, batch)
    assert torch.allclose(guided.loss, plain.loss, atol=1e-5)
    assert torch.equal(guided.tokens, plain.tokens) and plain.aux is None
    expected = 0.7 * reference_loss(model, batch, layers, heads, section.width)
    assert float(guided.aux.detach() / guided.tokens) == pytest.approx(expected, rel=1e-5)
    assert torch.allclose(guided.total, plain.loss + guided.aux, atol=1e-5)


def test_evaluation_is_plain_cross_entropy():
    batch = translation_batches(1, batch_size=5)[0]
    model = tiny_model(layers=2, **QUIET).eval()
    objective = GuidedAttention(TranslationObjective(0.1), GuidedAttentionSection(weight=1.0))
    guided, plain = objective(model, batch), TranslationObjective(0.1)(model, batch)
    assert guided.aux is None and torch.equal(guided.loss, plain.loss)
    assert torch.equal(guided.nll, plain.nll)


def test_the_guided_term_sums_with_a_mixture_of_experts_loss():
    batch = translation_batches(1, batch_size=5)[0]
    model = tiny_model(layers=2, n_experts=2, router_aux_loss_coef=0.01, **QUIET).train()
    torch.manual_seed(1)
    moe = TranslationObjective()(model, batch).aux.detach()
    torch.manual_seed(1)
    both = GuidedAttention(TranslationObjective(), GuidedAttentionSection(weight=0.5))
    terms = both(model, batch)
    guided = 0.5 * reference_loss(model, batch, [1], [0, 1], 0.2) * float(terms.tokens)
    assert float(terms.aux.detach()) == pytest.approx(float(moe) + guided, rel=1e-5)


def test_a_source_without_padding_mask_is_all_real():
    src, _ = pad([[5, 6, 7], [8, 9, 10]], 0)
    tgt, tgt_mask = pad([[1, 5, 6, 2], [1, 7, 2]], 0)
    model = tiny_model(layers=2, **QUIET).train()
    objective = GuidedAttention(TranslationObjective(), GuidedAttentionSection(weight=1.0))
    with_none = objective(model, Batch(src, None, tgt, tgt_mask))
    with_mask = objective(model, Batch(src, torch.ones_like(src, dtype=torch.bool), tgt, tgt_mask))
    assert torch.allclose(with_none.aux, with_mask.aux)


def test_the_task_wires_the_objective():
    model = tiny_model(layers=2)
    setup = TaskSetup(model, [], None, [], None)
    data = {"data": {"task": "translation"}, "train": {"label_smoothing": 0.2}}
    assert _objective(RunConfig.from_dict(data), setup) is None  # off: the shape's default
    config = RunConfig.from_dict({**data, "guided_attention": {"weight": 2.0}})
    objective = _objective(config, setup)
    assert isinstance(objective, GuidedAttention)
    assert isinstance(objective.base, TranslationObjective)
    assert objective.label_smoothing == 0.2 and objective.section.weight == 2.0


def test_a_training_run_records_the_guided_loss(tmp_path):
    objective = GuidedAttention(TranslationObjective(0.1), GuidedAttentionSection(weight=1.0))
    train = TrainSection(out_dir=str(tmp_path), steps=4, log_every=2, warmup=2, threads=1)
    result = Trainer(
        tiny_model(layers=2), translation_batches(2), train=train, objective=objective
    ).fit()
    records = [r for r in RunFolder(tmp_path).read_metrics() if "train_loss" in r]
    assert result.step == 4 and len(records) == 2
    assert all(0 < r["train_aux_loss"] < 1 for r in records)


def test_the_cli_trains_translation_with_guided_attention(tmp_path):
    config = translation_config(tmp_path)
    settings = ["guided_attention.weight=1.0", "guided_attention.layers=all"]
    assert main(["train", config, *(a for s in settings for a in ("--set", s))]) == 0
    run = RunFolder(tmp_path / "run")
    trained = [r for r in run.read_metrics() if "train_loss" in r]
    assert trained and all(0 < r["train_aux_loss"] < 1 for r in trained)
    assert [r["step"] for r in run.read_metrics() if "val_loss" in r] == [2, 4]
    saved = RunConfig.load(tmp_path / "run" / "run_config.toml").guided_attention
    assert saved == GuidedAttentionSection(weight=1.0, layers="all")
