"""Sparse mixture of experts in place of the feed-forward network.

Shazeer et al. 2017 ("Outrageously Large Neural Networks"), the Switch
Transformer (Fedus et al. 2021) and Mixtral (Jiang et al. 2024): N experts,
each a feed-forward network of `feedforward.py`, and a router W_r that sends
each token x to k of them,

    p = softmax(x W_r),    T = top-k(p),    y = sum_{i in T} (p_i / sum_{j in T} p_j) E_i(x)

The k weights are renormalised to sum to 1, as Mixtral does. With k = 1 this
makes the weight exactly 1, so the router then learns from the load-balancing
loss alone (the Switch Transformer scales by the raw p_i instead).

The Switch router (`router="switch"`, k = 1) keeps the raw weight p_i, so the
router learns from the task as well, and in training gives each expert room for
C = capacity_factor x T / N tokens of the batch: the tokens past an expert's C,
in order, are dropped (the layer outputs 0 for them, and the residual carries
them on), and counted in `dropped`. At inference no token is dropped, so a
token's output never depends on the rest of its batch.

Left alone, a router tends to send most tokens to a few experts. The
load-balancing loss (Switch Transformer, eq. 4) pushes it towards an even load:

    L_aux = N * sum_i f_i P_i,    f_i = (tokens sent to expert i) / T,    P_i = mean_x p_i(x)

over the T tokens of the batch. f_i counts tokens, so it sums to k and an even
load gives L_aux = k. f is a count and has no gradient; the loss trains the
router through P. This is the value of Hugging Face's `load_balancing_loss_func`
for one layer. A model's training loss adds `router_aux_loss_coef` times the sum
over its layers of L_aux (the Switch Transformer's practice; Hugging Face pools
the counts of all layers before multiplying).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.errors import AttnkitError
from attnkit.nn.feedforward import FeedForward
from attnkit.nn.linear import Linear


class MixtureOfExperts(nn.Module):
    """y = sum over the k experts the router picks of (renormalised p_i) E_i(x), per token.

    In training mode each forward pass leaves its load-balancing loss L_aux (a
    scalar tensor with a gradient through the router) in `aux_loss`; in
    evaluation mode it leaves None there.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        n_experts: int,
        top_k: int,
        activation: str = "relu",
        bias: bool = True,
        dropout: float = 0.0,
        router: str = "topk",
        capacity_factor: float = 1.25,
    ) -> None:
        super().__init__()
        self.switch, self.capacity_factor = router == "switch", capacity_factor
        self.dropped = 0  # tokens the switch router dropped in training, since last read
        if not 1 <= top_k <= n_experts:
            raise AttnkitError(
                f"a mixture of experts routes each token to between 1 and n_experts "
                f"({n_experts}) experts, got top_k {top_k}"
            )
        self.n_experts, self.top_k = n_experts, top_k
        self.router = Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(
            FeedForward(d_model, d_ff, activation, bias, dropout) for _ in range(n_experts)
        )
        self.aux_loss: Tensor | None = None

    def forward(self, x: Tensor, token_mask: Tensor | None = None) -> Tensor:
        """x (..., d_model) -> the same shape; each token is mixed on its own.

        `token_mask` (...), true at real tokens, keeps padding out of `aux_loss`;
        it does not change the output.
        """
        tokens = x.reshape(-1, x.shape[-1])
        # The softmax in float32 even under autocast: the top-k choice and the weights are
        # sensitive to small differences between close scores.
        probs = self.router(tokens).float().softmax(dim=-1)  # (T, N)
        weights, chosen = probs.topk(self.top_k, dim=-1)  # (T, k)
        keep = None
        if not self.switch:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        elif self.training and self.capacity_factor:
            keep = self._within_capacity(chosen[:, 0], token_mask)
        self.aux_loss = load_balancing_loss(probs, chosen, token_mask) if self.training else None
        return self._mix(tokens, weights, chosen, keep).view(x.shape)

    def _within_capacity(self, chosen: Tensor, token_mask: Tensor | None) -> Tensor:
        """Which tokens fit their expert's C slots, first come first served; padding takes none."""
        real = torch.ones_like(chosen, dtype=torch.bool)
        if token_mask is not None:
            real = token_mask.reshape(-1).bool()
        capacity = max(1, int(self.capacity_factor * int(real.sum()) / self.n_experts))
        queued = torch.nn.functional.one_hot(chosen, self.n_experts) * real[:, None]
        place = (queued.cumsum(0) * queued).sum(-1)  # 1-based place in its expert's queue
        keep = real & (place <= capacity)
        self.dropped += int((real & ~keep).sum())
        return keep

    def _mix(
        self, tokens: Tensor, weights: Tensor, chosen: Tensor, keep: Tensor | None = None
    ) -> Tensor:
        """sum_k w_k E_k(x) for every token: each expert runs once, on the tokens sent to it
        (with `keep`, (T,) for k = 1, only on those kept; the others get 0)."""
        slots, flat_weights = chosen.flatten(), weights.flatten()  # per (token, slot) pair
        pairs = None  # every pair, unless a capacity dropped some
        if keep is not None:
            pairs = keep.nonzero().squeeze(1)
            slots, flat_weights = slots[pairs], flat_weights[pairs]
        order = slots.argsort(stable=True)  # the pairs grouped by expert
        source = (order if pairs is None else pairs[order]) // self.top_k  # each pair's token
        counts = torch.bincount(slots, minlength=self.n_experts).tolist()
        groups = tokens[source].split(counts)
        # An expert with no tokens still runs while gradients are on, so each parameter has a
        # gradient after backward (DDP waits for one from every parameter).
        outputs = [
            expert(group)
            for expert, group in zip(self.experts, groups, strict=True)
            if len(group) or torch.is_grad_enabled()
        ]
        mixed = torch.cat(outputs) * flat_weights[order, None]
        return torch.zeros_like(tokens).index_add_(0, source, mixed.to(tokens.dtype))

    def __getstate__(self) -> dict:
        # The last aux_loss belongs to a graph, and a tensor inside a graph cannot be deep-copied.
        state = self.__dict__.copy()
        state["aux_loss"] = None
        return state


def load_balancing_loss(probs: Tensor, chosen: Tensor, token_mask: Tensor | None = None) -> Tensor:
    """L_aux = N sum_i f_i P_i over the tokens where `token_mask` is true (all if None).

    probs (T, N): the router's probabilities; chosen (T, k): the experts each token went to.
    """
    n_experts = probs.shape[-1]
    if token_mask is None:
        real = probs.new_ones(probs.shape[0])
    else:
        real = token_mask.reshape(-1).to(probs.dtype)
    n_tokens = real.sum().clamp(min=1)
    routed = probs.new_zeros(n_experts).index_add_(
        0, chosen.flatten(), real[:, None].expand(chosen.shape).flatten()
    )
    mean_prob = (probs * real[:, None]).sum(dim=0)
    return n_experts * (routed / n_tokens * mean_prob / n_tokens).sum()


def take_dropped_tokens(model: nn.Module) -> int | None:
    """The tokens the model's switch routers dropped since the last call (then reset), or
    None if it has no switch router."""
    switches = [m for m in model.modules() if isinstance(m, MixtureOfExperts) and m.switch]
    if not switches:
        return None
    dropped = sum(m.dropped for m in switches)
    for m in switches:
        m.dropped = 0
    return dropped


def router_aux_loss(model: nn.Module) -> Tensor | None:
    """The sum of L_aux over the mixtures of experts in `model` from its last training forward
    pass; None if it has none."""
    losses = [
        m.aux_loss
        for m in model.modules()
        if isinstance(m, MixtureOfExperts) and m.aux_loss is not None
    ]
    return torch.stack(losses).sum() if losses else None
