"""A reward model (Ouyang et al. 2022, "Training language models to follow instructions with
human feedback", section 3.5): the run's model with a scalar head, trained on preference pairs
by the Bradley-Terry loss.

The score of a response y to a prompt x is a linear map of one hidden state,

    r(x, y) = w . h_last + b

where h_last is the top layer's state at the last real token: of prompt and response read as
one sequence by a decoder-only model, or of the decoder reading <s> y </s> given x as its
source, for an encoder-decoder. Under Bradley and Terry's model a person prefers y_w to y_l
with probability sigmoid(r(x, y_w) - r(x, y_l)), so the loss of a pair is its negative log
likelihood (InstructGPT's eq. 1, one pair per comparison):

    L_BT = -log sigmoid(r(x, y_w) - r(x, y_l))

The head is a submodule of the model, `reward_head`, so the Trainer optimises, checkpoints and
averages it with the body, and the run folder's model.safetensors holds both; its config.json
is the body's, and `load_reward_model` rebuilds the pair. `data.task = "reward-model"` trains it
from a run config, starting from `train.init_from` as DPO does, on the pairs DPO reads
(`attnkit.data.preference`). PPO (`attnkit.train.ppo`) scores its samples with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import Tensor, nn

from attnkit.checks import check, with_article
from attnkit.config import ModelConfig
from attnkit.data.batch import Batch, pad
from attnkit.data.preference import PreferenceBatch, preference_splits
from attnkit.devices import check_device
from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel, build_model
from attnkit.models.base import unwrap
from attnkit.run import RunFolder
from attnkit.train.cross_entropy import LossTerms
from attnkit.train.loaders import run_loader
from attnkit.train.metrics import Metric
from attnkit.train.objectives import TrainingObjective, with_router_loss
from attnkit.train.run_config import RunConfig
from attnkit.train.run_model import run_model
from attnkit.train.run_tokenizer import run_tokenizer
from attnkit.weights import load_weights

HEAD = "reward_head"  # the submodule's name, and its weights' prefix in model.safetensors

Ids = Sequence[int]


def add_reward_head(model: TransformerModel, seed: int = 0) -> TransformerModel:
    """`model` with a new scalar head, `model.reward_head`: Linear(d_model, 1), its bias zero."""
    check(
        model.config.shape in ("decoder", "encoder-decoder"),
        f"a reward model scores responses of a decoder or an encoder-decoder, not of "
        f"{with_article(model.config.shape)} one",
    )
    generator = torch.Generator().manual_seed(seed)
    head = nn.Linear(model.config.d_model, 1)
    with torch.no_grad():
        # Small, so that every score starts near 0 and the first pairs' loss near log 2.
        head.weight.normal_(0.0, model.config.d_model**-0.5 / 10, generator=generator)
        head.bias.zero_()
    model.add_module(HEAD, head.to(next(model.parameters()).device))
    return model


def last_real(mask: Tensor | None, length: int, rows: int) -> Tensor:
    """The index of each row's last real token (rows,), for right-padded rows."""
    if mask is None:
        return torch.full((rows,), length - 1, dtype=torch.long)
    return mask.long().sum(-1) - 1


def reward_scores(model: nn.Module, batch: Batch) -> Tensor:
    """r(x, y) of each row of `batch` (rows,), in float32, with gradient: the head on the last
    real token's state. A decoder-only model reads `tgt` (prompt and response); an
    encoder-decoder reads `src` (the prompt) and `tgt` (<s> response </s>)."""
    plain = unwrap(model)
    if not hasattr(plain, HEAD):
        raise AttnkitError("this model has no reward head; add one with add_reward_head(model)")
    if plain.config.shape == "encoder-decoder":
        check(batch.src is not None, "an encoder-decoder's reward reads the prompt as its source")
        hidden = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask, need_logits=False)
    else:
        check(batch.src is None, "a decoder-only reward model reads prompt and response as one")
        hidden = model(batch.tgt, batch.tgt_mask, need_logits=False)
    hidden = hidden.hidden
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    last = last_real(batch.tgt_mask, hidden.shape[1], hidden.shape[0]).to(hidden.device)
    return getattr(plain, HEAD)(hidden[rows, last]).float().squeeze(-1)


def bradley_terry_loss(chosen: Tensor, rejected: Tensor) -> Tensor:
    """L_BT of each pair: -log sigmoid(r(y_w) - r(y_l))."""
    return -F.logsigmoid(chosen - rejected)


class BradleyTerry(TrainingObjective):
    """The Trainer's objective for a reward model: the summed L_BT of a `PreferenceBatch`'s
    pairs and their count (`LossTerms.tokens` counts pairs, as DPO's does)."""

    task = "reward-model"

    def __call__(self, model: nn.Module, batch: PreferenceBatch) -> LossTerms:
        scores = reward_scores(model, batch)
        losses = bradley_terry_loss(scores[: batch.pairs], scores[batch.pairs :])
        pairs = losses.new_tensor(float(batch.pairs))
        return with_router_loss(model, LossTerms(losses.sum(), losses.detach().sum(), pairs))


def reward_metric(batches: Iterable[PreferenceBatch], max_batches: int = 0) -> Metric:
    """The validation of a reward model over `batches` (its first `max_batches`; 0: all):

    val_loss         the mean L_BT
    reward_margin    the mean r(y_w) - r(y_l)
    reward_accuracy  the share of pairs the model ranks as people did (margin > 0)
    reward_chosen, reward_rejected   the mean score of each side
    """

    @torch.no_grad()
    def metric(model: TransformerModel) -> dict[str, float]:
        chosen, rejected = [], []
        for i, batch in enumerate(batches):
            if max_batches and i >= max_batches:
                break
            scores = reward_scores(model, batch.to(model.device)).double()
            chosen.append(scores[: batch.pairs])
            rejected.append(scores[batch.pairs :])
        good, bad = torch.cat(chosen), torch.cat(rejected)
        margins = good - bad
        return {
            "val_loss": bradley_terry_loss(good, bad).mean().item(),
            "reward_margin": margins.mean().item(),
            "reward_accuracy": (margins > 0).double().mean().item(),
            "reward_chosen": good.mean().item(),
            "reward_rejected": bad.mean().item(),
        }

    return metric


def task_parts(config: RunConfig) -> tuple:
    """What `data.task = "reward-model"` gives the Trainer (`attnkit.train.tasks.TaskSetup`'s
    fields): train.init_from's model and tokenizer with a new reward head, the pairs of the
    data.corpus folder, and the L_BT objective."""
    d = config.data
    tokenizer = run_tokenizer(config, ())  # train.init_from's
    model = add_reward_head(run_model(config, tokenizer), config.train.seed)
    splits = (d.train_split, d.valid_split)
    train, val = preference_splits(d.corpus, splits, tokenizer, model.config, d.max_len)
    # Rank 0 validates (the Trainer's metrics), over every validation pair.
    metric = reward_metric(run_loader(config, val, False, shard=False), config.eval.max_batches)
    return model, run_loader(config, train, True), None, [metric], tokenizer, BradleyTerry()


def load_reward_model(run_dir: str | Path, device: str | torch.device = "cpu") -> TransformerModel:
    """The reward model of a `reward-model` run folder, body and head, in eval mode."""
    device = check_device(device)
    folder = RunFolder(run_dir)
    for path in (folder.config, folder.weights):
        if not path.is_file():
            raise AttnkitError(
                f"{folder.root} is not a reward model's run folder: {path.name} is missing; "
                "train one with data.task = 'reward-model'"
            )
    with safe_open(str(folder.weights), "pt") as weights:
        names = set(weights.keys())
    if f"{HEAD}.weight" not in names:
        raise AttnkitError(
            f"{folder.root} holds a model without a reward head; train a reward model from "
            "it with data.task = 'reward-model' and give that run's folder"
        )
    model = add_reward_head(build_model(ModelConfig.from_json(folder.config)))
    load_weights(model, folder.weights, device)
    return model.to(device).eval()


def response_batch(
    prompts: Sequence[Ids],
    responses: Sequence[Ids],
    pad_id: int,
    decoder_start_id: int | None = None,
    eos_id: int | None = None,
) -> Batch:
    """Rows for `reward_scores`, as the reward model was trained on them: for a decoder-only
    model prompt + response in `tgt`; with `decoder_start_id` (an encoder-decoder) the prompts
    as `src` and <s> response </s> as `tgt`. Responses come without their EOS."""
    check(len(prompts) == len(responses), "one response per prompt")
    if decoder_start_id is None:
        tgt, mask = pad([[*p, *r] for p, r in zip(prompts, responses, strict=True)], pad_id)
        return Batch(tgt=tgt, tgt_mask=mask)
    check(eos_id is not None, "an encoder-decoder's responses end in its eos_id")
    src, src_mask = pad(list(prompts), pad_id)
    tgt, mask = pad([[decoder_start_id, *r, eos_id] for r in responses], pad_id)
    return Batch(src, src_mask, tgt, mask)
