"""The `ppo` task of `attnkit train`: RLHF's last stage, the policy tuned by PPO against a reward
model (`attnkit.train.ppo` has the objective and its equations).

    [data]   task = "ppo", corpus (a folder of {split}.jsonl pairs: their prompts are read),
             batch_size (prompts a rollout), max_len
    [ppo]    reward_model (a `reward-model` run folder), beta, gamma, lam, clip, epochs, ...
    [train]  init_from (the policy's start, and its reference), out_dir, steps, lr, seed, ...
    [eval]   every, decode_examples (validation prompts answered greedily), metric val_reward

A step is one PPO iteration: the policy samples a response to each of `data.batch_size`
prompts (the project's `generate`, on the KV cache), the reward model scores them, the policy,
its value head and the reference score every generated token in one teacher-forced pass each,
GAE gives the advantages, and `ppo.epochs` passes of `ppo.minibatches` AdamW steps follow at
the constant rate `train.lr`. Every pass runs without dropout (as TRL's PPO does), so that the
ratio pi/pi_old of the first minibatch is exactly 1. A decoder-only policy continues the prompt;
an encoder-decoder reads it as its source. With `lora.rank` the reference is the policy with its
LoRA update switched off, as DPO's is.

The run folder is an ordinary one (config.json, model.safetensors, tokenizer.json, which every
command reads) with the value head beside it (value_head.safetensors), metrics.jsonl and the run
config. The run saves every `train.save_every` steps, when it ends and when it is stopped, and
`attnkit train --resume` continues it where it saved (`attnkit.train.ppo_checkpoint`: the policy,
value head, AdamW's state, random states and prompt order; the reference built again).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from attnkit.checks import check
from attnkit.data.batch import pad
from attnkit.devices import resolve_device
from attnkit.files import atomic_write
from attnkit.generation import GenerationConfig, generate
from attnkit.generation.state import evaluating
from attnkit.models import TransformerModel
from attnkit.nn.lora import has_lora
from attnkit.run import RunFolder
from attnkit.tokenizer import Tokenizer
from attnkit.train import lock, new_run, ppo_checkpoint
from attnkit.train.ppo import (
    PPOSection,
    Rollouts,
    clipped_policy_loss,
    gae,
    kl_rewards,
    masked_mean,
    token_log_probs_and_values,
    value_loss,
    whiten,
)
from attnkit.train.ppo_prompts import batches, prompt_ids
from attnkit.train.preference import lora_switched_off
from attnkit.train.reward_model import load_reward_model, response_batch, reward_scores
from attnkit.train.run_config import RunConfig
from attnkit.train.run_model import run_model
from attnkit.train.run_tokenizer import run_tokenizer
from attnkit.train.stopping import Stopping, TrainResult
from attnkit.train.validate import validate

log = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.safetensors"  # `RunFolder.value_head`
Ids = Sequence[int]


class PPOTrainer:
    """The policy, its value head, the frozen reference and the reward model, and one PPO
    iteration (`step`) over a batch of prompts."""

    def __init__(
        self,
        policy: TransformerModel,
        reward_model: TransformerModel,
        section: PPOSection,
        *,
        lr: float = 1e-5,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        clip_norm: float = 1.0,
        seed: int = 0,
    ) -> None:
        check(
            policy.config.shape in ("decoder", "encoder-decoder"),
            "PPO samples responses from a decoder or an encoder-decoder policy",
        )
        check(
            reward_model.config.shape == policy.config.shape,
            f"the reward model is {reward_model.config.shape!r} but the policy is "
            f"{policy.config.shape!r}; train the reward model from the policy's run",
        )
        check(
            reward_model.config.vocab_size == policy.config.vocab_size,
            "the reward model reads another vocabulary than the policy's; train it from the "
            "policy's run (train.init_from), so that both share its tokenizer",
        )
        # Every pass without dropout: pi_old's, pi_ref's and the updates' are one function.
        self.policy, self.reward_model, self.section = policy.eval(), reward_model, section
        self.reward_model.requires_grad_(False).eval()
        self.reference = None
        if not has_lora(policy):
            self.reference = copy.deepcopy(policy).eval().requires_grad_(False)
        torch.manual_seed(seed)  # sampling draws from torch's generator: a seed repeats a run
        device = policy.device
        self.value_head = nn.Linear(policy.config.d_model, 1).to(device)
        with torch.no_grad():  # V starts at 0: no guess about the returns before the first
            self.value_head.weight.zero_()
            self.value_head.bias.zero_()
        trained = [p for p in policy.parameters() if p.requires_grad]
        self.parameters = [*trained, *self.value_head.parameters()]
        self.optimizer = torch.optim.AdamW(
            self.parameters, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay
        )
        self.clip_norm = clip_norm
        self.generator = torch.Generator().manual_seed(seed)
        c = policy.config
        self.encoder_decoder = c.shape == "encoder-decoder"
        self.pad_id, self.eos_id, self.start_id = c.pad_id, c.eos_id, c.decoder_start_id

    # -- rollouts ------------------------------------------------------------------------------

    def sample(self, prompts: Sequence[Ids], greedy: bool = False) -> list[list[int]]:
        """A response to each prompt, sampled (or greedy), each ending in EOS if it chose one."""
        s = self.section
        inputs, mask = pad(list(prompts), self.pad_id)
        device = self.policy.device
        options = (
            GenerationConfig()
            if greedy
            else GenerationConfig(do_sample=True, temperature=s.temperature)
        )
        with evaluating(self.policy):
            out = generate(
                self.policy,
                inputs.to(device),
                mask.to(device),
                options,
                max_new_tokens=self.max_new_tokens,
            )
        responses = []
        for row in out.sequences[:, out.prefix_length :].tolist():
            end = next((i + 1 for i, t in enumerate(row) if t in out.eos_token_ids), len(row))
            responses.append(row[:end])
        return responses

    @property
    def max_new_tokens(self) -> int:
        """`ppo.max_new_tokens`, within the model's length (an encoder-decoder's reward model
        reads <s> response </s>)."""
        room = self.policy.config.max_len - (2 if self.encoder_decoder else 0)
        return min(self.section.max_new_tokens, room)

    def prompts(self, config: RunConfig, tokenizer: Tokenizer, split: str) -> list[Ids]:
        """The split's prompts of the pairs folder, as ids, skipping those that leave no room
        for an answer (a decoder-only policy reads prompt and answer in one max_len)."""
        room = self.policy.config.max_len - (0 if self.encoder_decoder else self.max_new_tokens)
        room = min(room, config.data.max_len)
        return prompt_ids(config, tokenizer, split, self.encoder_decoder, room)

    def scores(self, prompts: Sequence[Ids], responses: Sequence[Ids]) -> Tensor:
        """The reward model's r(x, y) of each response (its EOS dropped: the model was trained
        on responses as the pairs give them)."""
        bare = [r[:-1] if r and r[-1] == self.eos_id else r for r in responses]
        start = self.start_id if self.encoder_decoder else None
        batch = response_batch(prompts, bare, self.pad_id, start, self.eos_id)
        with torch.no_grad():
            return reward_scores(self.reward_model, batch.to(self.policy.device))

    @torch.no_grad()
    def rollouts(self, prompts: Sequence[Ids]) -> Rollouts:
        """Sample, score and value a response to each prompt; rewards, advantages and returns."""
        s = self.section
        responses = self.sample(prompts)
        src = src_mask = None
        if self.encoder_decoder:
            src, src_mask = pad(list(prompts), self.pad_id)
            rows = [[self.start_id, *r] for r in responses]
            starts = [1] * len(rows)
        else:
            rows = [[*p, *r] for p, r in zip(prompts, responses, strict=True)]
            starts = [len(p) for p in prompts]
        tgt, tgt_mask = pad(rows, self.pad_id)
        columns = torch.arange(tgt.shape[1] - 1)[None, :] + 1  # the token each column predicts
        first = torch.tensor(starts)[:, None]
        actions = (columns >= first) & tgt_mask[:, 1:]
        device = self.policy.device
        src, src_mask, tgt, tgt_mask, actions = (
            None if t is None else t.to(device) for t in (src, src_mask, tgt, tgt_mask, actions)
        )
        log_probs, values = token_log_probs_and_values(
            self.policy, self.value_head, src, src_mask, tgt, tgt_mask, s.temperature
        )
        reference = self.reference or self.policy
        with nullcontext() if self.reference is not None else lora_switched_off(self.policy):
            ref_log_probs, _ = token_log_probs_and_values(
                reference, None, src, src_mask, tgt, tgt_mask, s.temperature
            )
        scores = self.scores(prompts, responses)
        mask = actions.to(log_probs.dtype)
        rewards, kl = kl_rewards(log_probs, ref_log_probs, scores, mask, s.beta)
        values = values * mask
        advantages, returns = gae(rewards, values, actions, s.gamma, s.lam)
        if s.whiten_advantages:
            advantages = whiten(advantages, mask)
        return Rollouts(
            src,
            src_mask,
            tgt,
            tgt_mask,
            actions,
            log_probs,
            values,
            advantages,
            returns,
            scores,
            kl,
        )

    # -- the update ----------------------------------------------------------------------------

    def loss(self, batch: Rollouts) -> tuple[Tensor, dict[str, Tensor]]:
        """L = L_clip + vf_coef L_V of a minibatch of rollouts, and what to record of it."""
        s = self.section
        log_probs, values = token_log_probs_and_values(
            self.policy,
            self.value_head,
            batch.src,
            batch.src_mask,
            batch.tgt,
            batch.tgt_mask,
            s.temperature,
        )
        mask = batch.actions.to(log_probs.dtype)
        policy_loss, clipped = clipped_policy_loss(
            log_probs, batch.log_probs, batch.advantages, mask, s.clip
        )
        v_loss = value_loss(values, batch.values, batch.returns, mask, s.value_clip)
        approx_kl = masked_mean(batch.log_probs - log_probs.detach(), mask)
        stats = {
            "policy_loss": policy_loss.detach(),
            "value_loss": v_loss.detach(),
            "clip_fraction": clipped,
            "approx_kl": approx_kl,
        }
        return policy_loss + s.vf_coef * v_loss, stats

    def step(self, prompts: Sequence[Ids]) -> dict[str, float]:
        """One PPO iteration on `prompts`; the means of its rollouts and of its updates."""
        s = self.section
        rollouts = self.rollouts(prompts)
        n = rollouts.tgt.shape[0]
        sums: dict[str, float] = {}
        updates = 0
        with evaluating(self.policy):  # no dropout, as in pi_old's pass
            for _ in range(s.epochs):
                order = torch.randperm(n, generator=self.generator)
                for part in order.chunk(min(s.minibatches, n)):
                    loss, stats = self.loss(rollouts.rows(part.to(rollouts.tgt.device)))
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    if self.clip_norm > 0:
                        torch.nn.utils.clip_grad_norm_(self.parameters, self.clip_norm)
                    self.optimizer.step()
                    for name, value in stats.items():
                        sums[name] = sums.get(name, 0.0) + value.item()
                    updates += 1
        record = {name: value / updates for name, value in sums.items()}
        lengths = rollouts.actions.sum(-1).double()
        record |= {
            "reward": rollouts.scores.mean().item(),
            "kl": rollouts.kl.mean().item(),
            "objective": (rollouts.scores - s.beta * rollouts.kl).mean().item(),
            "response_length": lengths.mean().item(),
        }
        return record

    def greedy_reward(self, prompts: Sequence[Ids]) -> float:
        """The mean reward-model score of the greedy responses to `prompts`."""
        return self.scores(prompts, self.sample(prompts, greedy=True)).mean().item()

    def save(
        self, folder: RunFolder, saved: ppo_checkpoint.Saved, run: dict[str, Any], keep: int
    ) -> None:
        """The value head, then the checkpoint of `saved.step` (the policy as a plain run
        folder's model among it; the last `keep` step checkpoints kept); `run` holds the
        settings and the reference's fingerprint."""
        state = {k: v.detach().cpu().contiguous() for k, v in self.value_head.state_dict().items()}
        atomic_write(folder.value_head, lambda p: save_file(state, str(p)))
        ppo_checkpoint.save(folder, self.policy, self.value_head, self.optimizer, saved, run, keep)


# -- the runner --------------------------------------------------------------------------------


def train(
    config: RunConfig,
    *,
    resume: bool = False,
    callbacks: Sequence[Callable[[dict[str, Any]], None]] = (),
    resume_command: str = "attnkit.train.tasks.train(config, resume=True)",
) -> TrainResult:
    """Tune train.init_from's model by PPO against ppo.reward_model, into train.out_dir."""
    validate(config)
    folder = RunFolder(config.train.out_dir)
    c, d, s = config.train, config.data, config.ppo
    device = resolve_device(c.device)
    tokenizer = run_tokenizer(config, ())  # train.init_from's
    policy = run_model(config, tokenizer).to(device)  # its copy is the frozen reference
    run = {
        "settings": ppo_checkpoint.settings(config),
        "reference": ppo_checkpoint.fingerprint(policy),
    }
    reward_model = load_reward_model(s.reward_model, device)
    ppo = PPOTrainer(
        policy,
        reward_model,
        s,
        lr=c.lr,
        weight_decay=c.weight_decay,
        betas=(c.beta1, c.beta2),
        eps=c.eps,
        clip_norm=c.clip_norm,
        seed=c.seed,
    )
    train_prompts = ppo.prompts(config, tokenizer, d.train_split)
    val_prompts = ppo.prompts(config, tokenizer, d.valid_split)[: config.eval.decode_examples]
    size = min(d.batch_size, len(train_prompts))
    stopping = Stopping(c.max_minutes, resume_command)
    history: list[dict[str, Any]] = []
    step, stopped = 0, "finished"
    check = None if resume else lambda: new_run.check_new_run(folder)
    with lock.hold(folder, check=check):
        if resume:
            step = ppo_checkpoint.restore(
                folder, policy, ppo.value_head, ppo.optimizer, ppo.generator, run, c.steps
            )
        saved = ppo_checkpoint.after_step(step, ppo.generator)
        folder.write_run_config(config.to_toml())
        tokenizer.save(folder.tokenizer)
        folder.record_tokenizer(tokenizer)  # the saved weights carry its fingerprint
        stopping.begin()
        with stopping.on_signals(lambda: step):
            for prompts in batches(train_prompts, size, c.seed, skip=step):
                if step >= c.steps:  # a resume of a run that had finished
                    break
                record = {"step": step + 1, **ppo.step(prompts), "lr": c.lr}
                step += 1
                saved = ppo_checkpoint.after_step(step, ppo.generator)
                record["minutes"] = round(stopping.minutes, 2)
                if step % c.log_every == 0 or step == c.steps:
                    folder.append_metrics(record)
                    history.append(record)
                    log.info(
                        "step %d/%d  reward %.4f  kl %.4f",
                        step,
                        c.steps,
                        record["reward"],
                        record["kl"],
                    )
                if step % config.eval.every == 0 or step == c.steps:
                    evaluation = {"step": step, "val_reward": ppo.greedy_reward(val_prompts)}
                    folder.append_metrics(evaluation)
                    history.append(evaluation)
                    log.info("step %d  val_reward %.4f", step, evaluation["val_reward"])
                info = {"step": step, "total": c.steps, "lr": c.lr, "loss": record["objective"]}
                for callback in callbacks:
                    callback({**info, "tokens_per_s": record["response_length"] * size})
                stopped = stopping.after(step, device, None) or "finished"
                if stopped != "finished" or step >= c.steps:
                    break
                if step % c.save_every == 0:
                    ppo.save(folder, saved, run, c.keep_last)
        ppo.save(folder, saved, run, c.keep_last)
    return TrainResult(policy, step, stopped, folder.root, history)
