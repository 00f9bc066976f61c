"""DPO: the log-probabilities and the loss computed by hand, the reference frozen (a copy, or
the model with its LoRA update off), and a small run whose margin grows on held-out pairs."""

import copy
import math

import pytest
import torch

from attnkit import AttnkitError
from attnkit.nn.lora import apply_lora
from attnkit.train.preference import DPO, dpo_loss, preference_batch, response_log_probs
from tests.helpers import tiny_model

PAIRS = [([3, 4, 5], [6, 7], [9, 10, 11]), ([8, 9], [12, 13, 14], [15])]


def by_hand(model, prompt, response):
    """log pi(y|x): each response token's log-softmax after the prompt and the tokens before."""
    total, ids = 0.0, list(prompt)
    for token in response:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].double()
        total += (logits.log_softmax(-1)[token]).item()
        ids.append(token)
    return total


def test_response_log_probs_are_sums_over_the_response_only():
    model = tiny_model("decoder").eval()
    batch = preference_batch(PAIRS, pad_id=0)
    with torch.no_grad():
        chosen = response_log_probs(model, batch.chosen)
        rejected = response_log_probs(model, batch.rejected)
    for row, (prompt, good, bad) in enumerate(PAIRS):
        assert chosen[row].item() == pytest.approx(by_hand(model, prompt, good), abs=1e-5)
        assert rejected[row].item() == pytest.approx(by_hand(model, prompt, bad), abs=1e-5)


def test_the_loss_is_eq_7_on_hand_computed_log_probabilities():
    chosen, rejected = torch.tensor([-3.0, -7.5]), torch.tensor([-4.0, -2.0])
    ref_chosen, ref_rejected = torch.tensor([-3.5, -6.0]), torch.tensor([-3.0, -2.5])
    loss, margins = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.5)
    # Pair 1: 0.5 ((-3 + 3.5) - (-4 + 3)) = 0.75; pair 2: 0.5 ((-7.5 + 6) - (-2 + 2.5)) = -1.
    assert margins.tolist() == [0.75, -1.0]
    expected = (math.log1p(math.exp(-0.75)) + math.log1p(math.exp(1.0))) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_at_the_start_the_policy_is_its_reference():
    model = tiny_model("decoder").eval()
    loss, margins = DPO(model, beta=0.1)(model, preference_batch(PAIRS, pad_id=0))
    torch.testing.assert_close(margins, torch.zeros(2), atol=1e-6, rtol=0)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-6)


def test_with_lora_the_reference_is_the_model_without_its_update():
    model = tiny_model("decoder").eval()
    apply_lora(model, rank=2)
    without = copy.deepcopy(model)
    torch.nn.init.normal_(model.decoder.blocks[0].self_attn.qkv_proj.lora_B)  # an update
    batch = preference_batch(PAIRS, pad_id=0)
    with torch.no_grad():
        policy = response_log_probs(model, batch.chosen)
        reference, _ = DPO(model).reference_log_probs(model, batch)
        torch.testing.assert_close(reference, response_log_probs(without, batch.chosen))
        assert not torch.allclose(policy, reference)
        # The update is back afterwards.
        torch.testing.assert_close(response_log_probs(model, batch.chosen), policy)


def pairs(n: int, seed: int):
    """Prompts of 3 to 5 tokens; the chosen response counts up from the prompt's last token,
    the rejected one is random: a preference the model can learn and generalise."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        prompt = torch.randint(3, 20, (int(torch.randint(3, 6, (1,), generator=g)),), generator=g)
        start = int(prompt[-1])
        chosen = [3 + (start + k - 2) % 21 for k in range(1, 5)]
        rejected = torch.randint(3, 24, (4,), generator=g).tolist()
        out.append((prompt.tolist(), chosen, rejected))
    return out


def test_training_through_lora_widens_the_margin_on_held_out_pairs():
    torch.manual_seed(0)
    model = tiny_model("decoder", layers=2)
    apply_lora(model, rank=4, alpha=8.0)
    dpo = DPO(model, beta=0.5)
    held_out = preference_batch(pairs(32, seed=99), pad_id=0)
    with torch.no_grad():
        _, before = dpo(model.eval(), held_out)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for step in range(40):
        loss, _ = dpo(model, preference_batch(pairs(16, seed=step), pad_id=0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        _, after = dpo(model.eval(), held_out)
    assert before.abs().max() < 1e-6  # LoRA's B starts at zero: the policy is the reference
    assert after.mean() > 1.0 and (after > 0).float().mean() > 0.9
    # The reference did not move: only the adapters trained.
    assert model.decoder.blocks[0].self_attn.qkv_proj.base.weight.grad is None


def test_a_merged_lora_model_is_refused_as_its_own_reference():
    model = tiny_model("decoder")
    apply_lora(model, rank=2)
    dpo = DPO(model)
    for layer in model.modules():
        if hasattr(layer, "merge"):
            layer.merge()
    with pytest.raises(AttnkitError, match="merged"):
        dpo(model, preference_batch(PAIRS, pad_id=0))


def test_bad_pairs_and_beta_are_refused_in_one_sentence():
    with pytest.raises(AttnkitError, match="needs a prompt, a chosen and a rejected"):
        preference_batch([([3], [], [4])], pad_id=0)
    with pytest.raises(AttnkitError, match="beta must be positive"):
        DPO(tiny_model("decoder"), beta=0.0)
