"""Label-smoothed cross-entropy, plain and fused with the output projection.

Label smoothing (section 5.4, epsilon_ls = 0.1) trains towards the target
distribution that puts 1 - eps on the true token and spreads eps evenly over the
vocabulary of V tokens,

    q = (1 - eps) * onehot(y) + eps / V,    loss = -sum_v q_v log p_v
         = (1 - eps) * NLL(y) + eps * mean_v(-log p_v)

summed over real target tokens only (targets equal to IGNORE count for nothing).
The functions return sums and a token count rather than a mean, so the trainer
can divide by the token count of the whole global batch.

`label_smoothed_cross_entropy` takes logits. `linear_cross_entropy` takes the
last hidden states and the head's weight, p = softmax(h W^T + b), and never
holds the (tokens, V) logits: it works through the rows in chunks and, while
each chunk's logits are at hand, already forms the gradient

    dloss/dz = p - q    (per kept row),  dh = (p - q) W,  dW = (p - q)^T h.

A training batch of 4,096 tokens over 8,000 words has 131 MB of logits. The
plain path writes four such matrices per step (logits, log-probabilities, their
gradient and the gradient of the logits), each freshly allocated. The fused path
reuses one chunk of about 16 MB instead: less memory and less time
(`python -m bench train` measures the whole step).

`chunked_cross_entropy` reaches the same sums another way, as litgpt and torchtune do: the
positions are cut into chunks, and each chunk runs through the head and
`label_smoothed_cross_entropy` under autograd, recomputed in backward
(`torch.utils.checkpoint`), so only one chunk's float32 logits exist at a time, in forward
and in backward. It is a plain autograd graph (torch.compile can fuse each chunk's
softmax), and its head product runs in the autocast dtype on the whole chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

IGNORE = -100

# Elements of one chunk of logits (16 MB in float32): large enough for a full-speed matrix
# product, small enough to stay in the last-level cache and be reused from one chunk to the next.
CHUNK_ELEMENTS = 1 << 22


@dataclass
class LossTerms:
    """Sums over the predicted tokens of one batch.

    loss: the training loss (label-smoothed when eps > 0).
    nll: the plain negative log-likelihood, for validation loss and perplexity.
    tokens: how many target tokens were predicted.
    aux: an auxiliary loss that training adds to `loss` (a mixture of experts'
        load-balancing loss), scaled by `tokens` so that it sums like `loss`;
        None when there is none. It is kept apart so the reported loss stays
        the cross-entropy.
    sequence: a sequence-level loss (`train/sequence_level.py`), weighted and
        scaled by `tokens` as `aux` is; None when there is none.
    reward, sources: the summed mean reward of each source's sampled
        sequences, and how many sources: recorded, not trained on.
    loss_weight: the weight of `loss` in what training minimises (sequence-level
        training mixes it with the cross-entropy).
    """

    loss: Tensor
    nll: Tensor
    tokens: Tensor
    aux: Tensor | None = None
    sequence: Tensor | None = None
    reward: Tensor | None = None
    sources: Tensor | None = None
    loss_weight: float = 1.0

    @property
    def total(self) -> Tensor:
        """What training minimises: `loss` (weighted) plus `aux` and `sequence`."""
        total = self.loss if self.loss_weight == 1 else self.loss_weight * self.loss
        for term in (self.aux, self.sequence):
            if term is not None:
                total = total + term
        return total

    def recorded(self) -> Tensor:
        """loss, tokens, aux, sequence, reward and sources as one float64 vector (0 where
        absent)."""
        zero = self.loss.new_zeros((), dtype=torch.float64)
        parts = (self.loss, self.tokens, self.aux, self.sequence, self.reward, self.sources)
        return torch.stack([zero if t is None else t.detach().double() for t in parts])


def label_smoothed_cross_entropy(
    logits: Tensor, targets: Tensor, label_smoothing: float = 0.0
) -> LossTerms:
    """Summed label-smoothed cross-entropy of logits (..., V) and targets (...)."""
    logp = logits.to(_softmax_dtype(logits.dtype)).log_softmax(dim=-1).flatten(0, -2)
    targets = targets.flatten()
    keep = targets != IGNORE
    # Ignored rows are zeroed rather than removed: selecting the kept rows would copy the
    # whole (tokens, vocabulary) matrix forward and scatter it back in the backward pass.
    nll = F.nll_loss(logp, targets, ignore_index=IGNORE, reduction="none")
    loss = (
        nll
        if label_smoothing == 0
        else (1 - label_smoothing) * nll - label_smoothing * logp.mean(dim=-1) * keep
    )
    return LossTerms(loss.sum(), nll.sum(), keep.sum())


def copy_cross_entropy(
    log_probs: Tensor, targets: Tensor, vocab_size: int, label_smoothing: float = 0.0
) -> LossTerms:
    """The same sums for a pointer-generator's log P (..., V + extra) over its extended vocabulary.

    Label smoothing is defined on the mixture P, with its eps spread over the V ids of
    the vocabulary (the extra ids differ from sentence to sentence):

        loss = (1 - eps) * -log P(y) + eps * mean_{v < V}(-log P(v))
    """
    logp = log_probs.flatten(0, -2)
    targets = targets.flatten()
    keep = targets != IGNORE
    if not bool(keep.all()):
        logp, targets = logp[keep], targets[keep]
    nll = -logp.gather(1, targets[:, None]).squeeze(1)
    loss = nll
    if label_smoothing:
        loss = (1 - label_smoothing) * nll - label_smoothing * logp[:, :vocab_size].mean(-1)
    return LossTerms(loss.sum(), nll.detach().sum(), keep.sum())


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    label_smoothing: float = 0.0,
) -> LossTerms:
    """The same sums for logits = hidden W^T + b, without materialising the logits.

    hidden (..., d_model), weight (V, d_model), bias (V) or None, targets (...).
    """
    targets = targets.flatten()
    keep = targets != IGNORE
    hidden = hidden.flatten(0, -2)
    # Ignored rows (padding, unmasked tokens of a masked LM) are dropped before the product:
    # the rows are d_model wide here, not V, so selecting them is cheap.
    if not bool(keep.all()):
        hidden, targets = hidden[keep], targets[keep]
    loss, nll = _LinearCrossEntropy.apply(hidden, weight, bias, targets, label_smoothing)
    return LossTerms(loss, nll, keep.sum())


def chunked_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    label_smoothing: float = 0.0,
    *,
    chunks: int = 8,
    recompute: bool = True,
) -> LossTerms:
    """The sums of `linear_cross_entropy`, chunk by chunk of positions under autograd.

    hidden (..., d_model), weight (V, d_model), bias (V) or None, targets (...). With
    `recompute` (and gradients on) each chunk keeps only its inputs for backward and
    recomputes its logits there; without it, autograd keeps every chunk's float32
    log-probabilities, the whole (tokens, V) matrix again.
    """
    hidden, targets = hidden.flatten(0, -2), targets.flatten()
    keep = targets != IGNORE
    loss = nll = hidden.new_zeros((), dtype=_softmax_dtype(hidden.dtype))
    for h, t in zip(hidden.chunk(chunks), targets.chunk(chunks), strict=True):
        if recompute and torch.is_grad_enabled():
            part, part_nll = checkpoint(
                _chunk_loss, h, weight, bias, t, label_smoothing, use_reentrant=False
            )
        else:
            part, part_nll = _chunk_loss(h, weight, bias, t, label_smoothing)
        loss, nll = loss + part, nll + part_nll.detach()
    return LossTerms(loss, nll, keep.sum())


def _chunk_loss(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    """One chunk's logits (in the autocast dtype, if any) and their summed losses."""
    terms = label_smoothed_cross_entropy(F.linear(hidden, weight, bias), targets, eps)
    return terms.loss, terms.nll


def _softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """The softmax runs in float32 at least (float64 stays float64)."""
    return torch.promote_types(dtype, torch.float32)


class _LinearCrossEntropy(torch.autograd.Function):
    """Forward computes the loss sums and, when gradients are needed, the gradients too.

    The loss is a scalar, so backward only scales the stored gradients by its incoming
    gradient. Under autocast the products run in the autocast dtype and the softmax in
    float32, as autocast would do for a linear layer followed by `log_softmax`.
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        eps: float,
    ) -> tuple[Tensor, Tensor]:
        device = hidden.device.type
        dtype = (
            torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        )
        acc = _softmax_dtype(dtype)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        need_grad = need_h or need_w or need_b
        with torch.autocast(device, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            n, vocab = h.shape[0], w.shape[0]
            loss = torch.zeros((), dtype=acc, device=hidden.device)
            nll = torch.zeros_like(loss)
            grad_h = torch.empty_like(h) if need_h else None
            grad_w = torch.zeros(w.shape, dtype=acc, device=w.device) if need_w else None
            grad_b = torch.zeros(vocab, dtype=acc, device=w.device) if need_b else None
            rows = max(1, CHUNK_ELEMENTS // vocab)
            # One buffer serves every chunk: a fresh 16 MB matrix per chunk costs as much in
            # page faults as its product (measured on a CPU; the allocator returns it each time).
            chunk = torch.empty(min(rows, n), vocab, dtype=acc, device=h.device)
            for start in range(0, n, rows):
                hs, ts = h[start : start + rows], targets[start : start + rows]
                z = chunk[: len(hs)]
                if dtype == acc:
                    torch.mm(hs, w.t(), out=z)
                else:
                    z.copy_(hs @ w.t())
                if bias is not None:
                    z += bias
                # log p_y = z_y - logsumexp(z); the smoothing term needs mean_v z_v.
                z_target = z.gather(1, ts[:, None]).squeeze(1)
                z_mean = z.mean(dim=1) if eps else None
                z_max = z.amax(dim=1, keepdim=True)
                p = z.sub_(z_max).exp_()  # unnormalised probabilities, in place of z
                total = p.sum(dim=1, keepdim=True)
                log_z = (total.log() + z_max).squeeze(1)
                nll_sum = (log_z - z_target).sum()
                nll += nll_sum
                loss += nll_sum if not eps else (1 - eps) * nll_sum + eps * (log_z - z_mean).sum()
                if not need_grad:
                    continue
                # dloss/dz = p - q with q = (1 - eps) onehot(y) + eps / V.
                p.div_(total)
                if eps:
                    p.sub_(eps / vocab)
                p.scatter_add_(1, ts[:, None], p.new_full((len(ts), 1), eps - 1))
                g = p.to(dtype)
                if grad_h is not None:
                    torch.mm(g, w, out=grad_h[start : start + rows])
                if grad_w is not None and g.dtype == acc:
                    grad_w.addmm_(g.t(), hs)
                elif grad_w is not None:  # accumulate the low-precision products in float32
                    grad_w += g.t() @ hs
                if grad_b is not None:
                    grad_b += p.sum(dim=0)
        ctx.save_for_backward(
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
        )
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_loss: Tensor, _grad_nll: Tensor
    ) -> tuple[Tensor | None, ...]:
        grads = [None if g is None else g * grad_loss for g in ctx.saved_tensors]
        return (*grads, None, None)
