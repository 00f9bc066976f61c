"""Mixture of experts: Mixtral's routing and Switch's balancing loss, in a model and training."""

import copy

import pytest
import torch
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import (
    MixtralSparseMoeBlock,
    load_balancing_loss_func,
)

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.generation import generate
from attnkit.nn import FeedForward, LoRALinear, MixtureOfExperts, apply_lora, merge_lora
from attnkit.nn.moe import load_balancing_loss, router_aux_loss, take_dropped_tokens
from attnkit.train import Trainer
from attnkit.train.objectives import TranslationObjective
from attnkit.train.run_config import TrainSection
from tests.helpers import padded_batch, randomise_updates, tiny_model, translation_batches

D_MODEL, D_FF, N_EXPERTS = 16, 24, 4


def hf_block_and_ours(top_k: int) -> tuple[MixtralSparseMoeBlock, MixtureOfExperts]:
    """Hugging Face's Mixtral block with random weights, and ours holding the same weights."""
    config = MixtralConfig(
        hidden_size=D_MODEL,
        intermediate_size=D_FF,
        num_local_experts=N_EXPERTS,
        num_experts_per_tok=top_k,
        hidden_act="silu",
        router_jitter_noise=0.0,
    )
    hf = MixtralSparseMoeBlock(config).eval()
    ours = MixtureOfExperts(D_MODEL, D_FF, N_EXPERTS, top_k, activation="swiglu", bias=False)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(std=0.5)
        ours.router.weight.copy_(hf.gate.weight)
        for i, expert in enumerate(ours.experts):
            expert.w_1.weight.copy_(hf.experts.gate_up_proj[i])  # gate rows first, as ours
            expert.w_2.weight.copy_(hf.experts.down_proj[i])
    return hf, ours.eval()


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("top_k", [1, 2, N_EXPERTS])
def test_matches_hugging_face_mixtral_sparse_moe_block(top_k, grad):
    hf, ours = hf_block_and_ours(top_k)
    x = torch.randn(3, 7, D_MODEL)
    with torch.set_grad_enabled(grad):
        expected = hf(x.clone())
        torch.testing.assert_close(ours(x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("masked", [False, True])
def test_aux_loss_equals_hugging_face_load_balancing_loss(masked, top_k):
    _, ours = hf_block_and_ours(top_k)
    ours.train()
    x = torch.randn(3, 7, D_MODEL)
    _, mask = padded_batch([7, 4, 2], 7)
    ours(x, mask if masked else None)
    logits = ours.router(x.reshape(-1, D_MODEL))
    expected = load_balancing_loss_func(
        (logits,), N_EXPERTS, top_k, attention_mask=mask if masked else None
    )
    torch.testing.assert_close(ours.aux_loss, expected, atol=1e-6, rtol=1e-6)
    ours.aux_loss.backward()
    assert ours.router.weight.grad.abs().sum() > 0
    ours.eval()
    ours(x)
    assert ours.aux_loss is None


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_identical_experts_are_one_feed_forward(top_k):
    """The k weights sum to 1, so experts that are all alike mix to that one network."""
    ff = FeedForward(D_MODEL, D_FF, "gelu")
    moe = MixtureOfExperts(D_MODEL, D_FF, 3, top_k, "gelu")
    for expert in moe.experts:
        expert.load_state_dict(ff.state_dict())
    x = torch.randn(2, 5, D_MODEL)
    torch.testing.assert_close(moe(x), ff(x), atol=1e-6, rtol=1e-5)


def test_each_token_is_routed_and_mixed_on_its_own():
    _, moe = hf_block_and_ours(2)
    x = torch.randn(4, 6, D_MODEL)
    full = moe(x)
    alone = torch.cat([moe(token) for token in x.reshape(-1, 1, D_MODEL)])
    torch.testing.assert_close(alone.view_as(full), full, atol=1e-5, rtol=1e-5)
    changed = x.clone()
    changed[1:] = torch.randn(3, 6, D_MODEL)
    torch.testing.assert_close(moe(changed)[0], full[0], atol=0, rtol=0)


def test_top_k_outside_one_to_n_experts_is_refused():
    with pytest.raises(AttnkitError, match="top_k 5"):
        MixtureOfExperts(D_MODEL, D_FF, 4, 5)


def moe_model(shape: str = "decoder", **changes) -> torch.nn.Module:
    no_dropout = {"dropout": 0.0, "embedding_dropout": 0.0}
    return tiny_model(shape, n_experts=4, n_experts_per_token=2, **no_dropout, **changes)


@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_a_model_with_experts_decodes_the_same_with_and_without_the_cache(shape):
    model = moe_model(shape, activation="swiglu").eval()
    blocks = [m for m in model.modules() if hasattr(m, "ff")]
    assert blocks and all(isinstance(b.ff, MixtureOfExperts) for b in blocks)
    ids, mask = padded_batch([5, 3, 1], 5)
    ids = ids.clamp(max=23)
    options = {"max_new_tokens": 8, "eos_token_id": (), "decoder_start_token_id": 1}
    cached = generate(model, ids, mask, **options).sequences
    uncached = generate(model, ids, mask, use_cache=False, **options).sequences
    assert torch.equal(cached, uncached)


def test_a_training_step_trains_router_and_experts_and_adds_the_aux_loss():
    batch = translation_batches(1)[0]
    objective = TranslationObjective(label_smoothing=0.1)
    without = objective(moe_model("encoder-decoder", router_aux_loss_coef=0.0).train(), batch)
    model = moe_model("encoder-decoder", router_aux_loss_coef=0.5).train()
    terms = objective(model, batch)
    aux = router_aux_loss(model)
    layers = [m for m in model.modules() if isinstance(m, MixtureOfExperts)]
    assert len(layers) == 2
    torch.testing.assert_close(aux, sum(m.aux_loss for m in layers))
    torch.testing.assert_close(terms.loss, without.loss, atol=0, rtol=0)  # loss stays the CE
    assert without.aux is None
    torch.testing.assert_close(terms.total - terms.loss, 0.5 * aux * terms.tokens)
    terms.total.backward()
    for moe in layers:
        assert moe.router.weight.grad.abs().sum() > 0
        grads = [p.grad for p in moe.experts.parameters()]
        assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)
    copy.deepcopy(model)  # the aux loss left on the layers is not copied
    # Evaluation (validation loss, perplexity) is the cross-entropy alone.
    with torch.no_grad():
        assert objective(model.eval(), batch).aux is None


def test_the_trainer_reports_the_cross_entropy_without_the_aux_loss(tmp_path):
    model = moe_model("encoder-decoder", router_aux_loss_coef=1.0)
    batch = translation_batches(1)[0]
    expected = TranslationObjective(0.1)(copy.deepcopy(model).train(), batch)
    settings = TrainSection(
        out_dir=str(tmp_path), steps=1, warmup=1, threads=1, log_every=1, device="cpu",
        reuse_freed_memory=False,
    )  # fmt: skip
    result = Trainer(model, [batch], train=settings).fit()
    loss = float(expected.loss.detach() / expected.tokens)
    assert float(expected.total.detach() / expected.tokens) > loss + 1  # the aux loss is not small
    assert result.history[0]["train_loss"] == pytest.approx(loss, rel=1e-6)
    aux = float(expected.aux.detach() / expected.tokens)
    assert result.history[0]["train_aux_loss"] == pytest.approx(aux, rel=1e-6)


def test_lora_adapts_the_experts_by_pattern():
    model = moe_model().eval()
    ids = torch.randint(5, 24, (2, 6))
    before = model(ids).logits
    names = apply_lora(model, rank=2, targets=("*.experts.*.w_1",))
    assert len(names) == 2 * 4 and all(".ff.experts." in n for n in names)
    randomise_updates(model)
    adapted = model(ids).logits
    assert not torch.allclose(adapted, before, atol=1e-4)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(n.endswith((".lora_A", ".lora_B")) for n in trainable)
    merge_lora(model)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    torch.testing.assert_close(model(ids).logits, adapted, atol=1e-5, rtol=1e-5)


def test_an_expert_without_tokens_still_gets_a_gradient():
    """Every parameter takes part in backward (DDP waits for a gradient from each)."""
    moe = MixtureOfExperts(D_MODEL, D_FF, N_EXPERTS, 2)
    with torch.no_grad():
        moe.router.weight.copy_(torch.tensor([1.0, 1.0, -1.0, -1.0])[:, None].expand(-1, D_MODEL))
    moe(torch.rand(3, 5, D_MODEL)).sum().backward()
    unused = [p.grad for expert in moe.experts[2:] for p in expert.parameters()]
    assert all(g is not None and not g.any() for g in unused)


def test_padding_stays_out_of_a_models_balancing_loss():
    model = moe_model("decoder").train()
    ids = torch.randint(5, 24, (1, 6))
    model(ids)
    alone = router_aux_loss(model)
    padded = torch.cat([ids, torch.full((1, 4), 0)], 1)
    mask = torch.arange(10)[None] < 6
    model(padded, mask)
    torch.testing.assert_close(router_aux_loss(model), alone)
    model(padded)  # the same tokens counted as real change the loss
    assert not torch.allclose(router_aux_loss(model), alone)


def _switch(capacity_factor: float = 1.25) -> MixtureOfExperts:
    torch.manual_seed(0)
    return MixtureOfExperts(
        8, 16, n_experts=4, top_k=1, router="switch", capacity_factor=capacity_factor
    )


def test_the_switch_router_weights_its_one_expert_by_the_raw_probability() -> None:
    moe = _switch().eval()
    x = torch.randn(10, 8)
    probs = moe.router(x).softmax(-1)
    p, chosen = probs.max(-1)
    expected = torch.stack([p[t] * moe.experts[int(chosen[t])](x[t : t + 1])[0] for t in range(10)])
    assert torch.allclose(moe(x), expected, atol=1e-6)
    assert moe.dropped == 0


def test_the_switch_router_drops_what_passes_capacity_in_training_only() -> None:
    moe = _switch(capacity_factor=0.5).train()
    x = torch.randn(24, 8)
    chosen = moe.router(x).argmax(-1)
    capacity = int(0.5 * 24 / 4)  # 3 tokens an expert
    seen = torch.zeros(4, dtype=torch.long)
    kept = []
    for e in chosen.tolist():  # first come, first served
        seen[e] += 1
        kept.append(bool(seen[e] <= capacity))
    kept = torch.tensor(kept)
    out = moe(x)
    assert moe.dropped == int((~kept).sum()) > 0
    assert torch.equal(out[~kept], torch.zeros_like(out[~kept]))  # the residual carries them
    moe.eval()
    assert torch.allclose(moe(x)[kept], out[kept], atol=1e-6)
    assert (moe(x)[~kept].abs().sum(-1) > 0).all()  # at inference nothing is dropped
    probs = moe.router(x).softmax(-1)
    loss = load_balancing_loss(probs, chosen[:, None])
    f = torch.bincount(chosen, minlength=4).float() / 24
    assert torch.allclose(loss, 4 * (f * probs.mean(0)).sum())  # N sum_i f_i P_i, k = 1


def test_padding_takes_no_capacity_and_the_dropped_count_is_read_once() -> None:
    moe = _switch(capacity_factor=1.0).train()
    x = torch.randn(2, 8, 8)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, 4:] = False  # 12 real tokens: 3 an expert
    chosen = moe.router(x.reshape(16, 8)).argmax(-1)[mask.flatten()]
    expected = int((torch.bincount(chosen, minlength=4) - 3).clamp(min=0).sum())
    moe(x, mask)
    model = torch.nn.Sequential(moe)
    assert take_dropped_tokens(model) == expected
    assert take_dropped_tokens(model) == 0  # read, then reset
    assert take_dropped_tokens(torch.nn.Sequential(torch.nn.Linear(2, 2))) is None


def test_the_switch_router_needs_one_expert_a_token() -> None:
    with pytest.raises(AttnkitError, match="switch router sends each token to one expert"):
        ModelConfig(n_experts=4, n_experts_per_token=2, router="switch")


def test_a_switch_model_trains_and_logs_its_dropped_tokens(tmp_path):
    model = tiny_model(n_experts=4, n_experts_per_token=1, router="switch", capacity_factor=0.5)
    settings = TrainSection(
        out_dir=str(tmp_path), steps=2, warmup=1, threads=1, log_every=1, device="cpu",
        reuse_freed_memory=False,
    )  # fmt: skip
    result = Trainer(model, translation_batches(2), train=settings).fit()
    records = [r for r in result.history if "train_loss" in r]
    assert all(r["dropped_tokens"] > 0 for r in records)  # half the room: some must drop
