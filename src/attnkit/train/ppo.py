"""Proximal policy optimisation against a reward model, with a KL penalty to the frozen reference
(Schulman et al. 2017, "Proximal Policy Optimization Algorithms"; as RLHF uses it: Ziegler et
al. 2019, Ouyang et al. 2022, "InstructGPT").

The policy pi (the run being tuned) samples a response y_1 .. y_T to a prompt x; each token is
an action, taken in the state s_t = (x, y_<t). The reward of a token is the penalty for leaving
the reference pi_ref (the same run, frozen), and the last token also earns the reward model's
score of the whole response:

    r_t = -beta (log pi(y_t|s_t) - log pi_ref(y_t|s_t))  +  [t = T] r_RM(x, y)

(summed over t the penalty is beta times the sampled estimate of KL(pi || pi_ref)). A value
head V(s_t) on the policy's own hidden states estimates the return, and generalised advantage
estimation (Schulman et al. 2016) weighs the temporal differences:

    delta_t = r_t + gamma V(s_{t+1}) - V(s_t)          (V after the last token is 0)
    A_t     = delta_t + gamma lambda A_{t+1}            returns R_t = A_t + V(s_t)

For several epochs over each batch of rollouts, the policy minimises the clipped surrogate of
eq. 7 and the value head the squared error to the returns, clipped around the rollout's values
as in the PPO code InstructGPT trained with:

    rho_t  = pi(y_t|s_t) / pi_old(y_t|s_t)
    L_clip = -mean_t min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t)
    L_V    = 1/2 mean_t max((V - R_t)^2, (V_old + clip(V - V_old, -eps_V, eps_V) - R_t)^2)
    L      = L_clip + vf_coef L_V

The means run over the generated tokens of the batch. `data.task = "ppo"` trains it from a run
config (`attnkit.train.ppo_task`) with the [ppo] section below.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.checks import finite_fields, non_negative, positive, within


@dataclass(frozen=True)
class PPOSection:
    """PPO against a reward model (`data.task = "ppo"`), fine-tuning the run of
    `train.init_from` with a KL penalty to itself, frozen; `data.batch_size` prompts a rollout.

    reward_model: the run folder of a `reward-model` run, with the policy's tokenizer.
    beta: the weight of the per-token KL penalty to the reference (InstructGPT: 0.02).
    gamma, lam: the discount and GAE's lambda (1 and 0.95, as in RLHF's PPO).
    clip: epsilon of the clipped surrogate: the ratio pi/pi_old is held within 1 +- clip.
    value_clip: epsilon_V, how far a value may move from the rollout's in one batch (0: no clip).
    vf_coef: the weight of the value loss beside the policy's.
    epochs: passes of PPO over each batch of rollouts.
    minibatches: optimizer steps per pass, each over that share of the rollouts.
    max_new_tokens: the longest response sampled.
    temperature: of the softmax responses are sampled from (1: the policy itself).
    whiten_advantages: standardise the advantages over each batch's tokens.
    """

    reward_model: str = ""
    beta: float = 0.02
    gamma: float = 1.0
    lam: float = 0.95
    clip: float = 0.2
    value_clip: float = 0.2
    vf_coef: float = 0.1
    epochs: int = 4
    minibatches: int = 1
    max_new_tokens: int = 40
    temperature: float = 1.0
    whiten_advantages: bool = True

    def __post_init__(self) -> None:
        s = "ppo"
        finite_fields(self, s)
        non_negative(f"{s}.beta", self.beta)
        within(f"{s}.gamma", self.gamma, "(0, 1]")
        within(f"{s}.lam", self.lam, "[0, 1]")
        within(f"{s}.clip", self.clip, "(0, 1)")
        non_negative(f"{s}.value_clip", self.value_clip)
        non_negative(f"{s}.vf_coef", self.vf_coef)
        for name in ("epochs", "minibatches", "max_new_tokens", "temperature"):
            positive(f"{s}.{name}", getattr(self, name))


def kl_rewards(
    log_probs: Tensor, ref_log_probs: Tensor, scores: Tensor, mask: Tensor, beta: float
) -> tuple[Tensor, Tensor]:
    """The per-token rewards r_t (rows, T) and each row's sampled KL, sum_t log pi - log pi_ref
    (rows,): the penalty at every generated token (`mask`), the score (rows,) added at each
    row's last one."""
    kl = (log_probs - ref_log_probs) * mask
    rewards = -beta * kl
    last = last_true(mask)
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows, last] += scores.to(rewards.dtype) * mask.any(-1)
    return rewards, kl.sum(-1)


def last_true(mask: Tensor) -> Tensor:
    """The column of each row's last True (0 for a row of none)."""
    columns = torch.arange(mask.shape[1], device=mask.device)
    return (mask.long() * (columns + 1)).argmax(-1) * mask.any(-1)


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Advantages A_t and returns R_t = A_t + V(s_t) (rows, T) of the tokens where `mask` is
    True; the states between them (a prompt, padding) are skipped, and each row's last token
    is terminal. Zero where `mask` is False."""
    rows, length = rewards.shape
    next_value = rewards.new_zeros(rows)
    next_advantage = rewards.new_zeros(rows)
    advantages = torch.zeros_like(rewards)
    for t in range(length - 1, -1, -1):  # backwards: each A_t needs A_{t+1}
        real = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(real, advantage, 0.0)
        next_value = torch.where(real, values[:, t], next_value)
        next_advantage = torch.where(real, advantage, next_advantage)
    return advantages, (advantages + values) * mask


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def whiten(x: Tensor, mask: Tensor) -> Tensor:
    """`x` standardised to mean 0 and variance 1 over the positions of `mask`."""
    mean = masked_mean(x, mask)
    variance = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(variance + 1e-8) * mask


def clipped_policy_loss(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor, clip: float
) -> tuple[Tensor, Tensor]:
    """L_clip over the tokens of `mask`, and the share of them whose ratio was clipped."""
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - clip, 1 + clip) * advantages
    loss = masked_mean(-torch.minimum(unclipped, clipped), mask)
    fraction = masked_mean(((ratio - 1).abs() > clip).to(ratio.dtype), mask)
    return loss, fraction.detach()


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float
) -> Tensor:
    """L_V over the tokens of `mask`; `clip` 0 is the plain squared error."""
    loss = (values - returns) ** 2
    if clip > 0:
        moved = old_values + (values - old_values).clamp(-clip, clip)
        loss = torch.maximum(loss, (moved - returns) ** 2)
    return 0.5 * masked_mean(loss, mask)


@dataclass
class Rollouts:
    """A batch of sampled responses and what PPO needs of each generated token.

    `tgt` (rows, L) is what the decoder reads, right-padded: prompt + response for a
    decoder-only model, <s> response for an encoder-decoder (whose prompts are `src`). The
    per-token tensors are (rows, L - 1): column j is the token tgt[:, j + 1], predicted from
    the states up to j; `actions` is True at the generated ones.
    """

    src: Tensor | None
    src_mask: Tensor | None
    tgt: Tensor
    tgt_mask: Tensor
    actions: Tensor
    log_probs: Tensor  # of pi_old, the policy that sampled them
    values: Tensor
    advantages: Tensor
    returns: Tensor
    scores: Tensor  # the reward model's, (rows,)
    kl: Tensor  # sum_t log pi_old - log pi_ref, (rows,)

    def rows(self, index: Tensor) -> Rollouts:
        def take(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[index]

        return Rollouts(*(take(getattr(self, f)) for f in self.__dataclass_fields__))


def token_log_probs_and_values(
    model: nn.Module,
    value_head: nn.Module | None,
    src: Tensor | None,
    src_mask: Tensor | None,
    tgt: Tensor,
    tgt_mask: Tensor,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor | None]:
    """log pi(tgt[:, j+1] | tgt[:, :j+1]) of each column j (rows, L - 1), under the softmax
    of logits / temperature that sampled them, and V of the same states (None without a head)."""
    if src is not None:
        hidden = model(src, tgt, src_mask, tgt_mask, need_logits=False).hidden
    else:
        hidden = model(tgt, tgt_mask, need_logits=False).hidden
    hidden = hidden[:, :-1]
    logits = model.head(hidden).float() / temperature
    log_probs = logits.log_softmax(-1).gather(-1, tgt[:, 1:, None]).squeeze(-1)
    values = None if value_head is None else value_head(hidden).float().squeeze(-1)
    return log_probs, values
