"""PPO: GAE against a NumPy transcription, the clipped surrogate and the value loss against hand
computations, the KL penalty zero while the policy is its reference, a tiny PPO run of each
model shape that raises the reward model's mean score, and one stopped halfway and resumed that
ends with the weights of one that ran through."""

import math

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from attnkit import AttnkitError
from attnkit.cli import main
from attnkit.data.preference import read_pairs
from attnkit.evaluation.run import read_eval_set
from attnkit.nn.lora import apply_lora
from attnkit.run import RunFolder, load_pretrained, load_run
from attnkit.train.ppo import (
    PPOSection,
    clipped_policy_loss,
    gae,
    kl_rewards,
    value_loss,
    whiten,
)
from attnkit.train.ppo_task import VALUE_HEAD_FILE, PPOTrainer
from attnkit.train.reward_model import add_reward_head, load_reward_model
from attnkit.train.run_config import RunConfig
from attnkit.train.tasks import train
from tests.helpers import tiny_model, tiny_run, write_preference_pairs

ALPHABET = "adehiklnprstu"  # letters tiny_run's character tokenizer knows


def gae_numpy(rewards, values, gamma, lam):
    """GAE of one episode, as the papers write it, in float64."""
    advantages, next_value, running = np.zeros(len(rewards)), 0.0, 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
        next_value = values[t]
    return advantages, advantages + np.asarray(values)


def test_gae_matches_numpy_per_episode_skipping_prompts_and_padding():
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(3, 7, generator=g, dtype=torch.float64)
    values = torch.randn(3, 7, generator=g, dtype=torch.float64)
    mask = torch.zeros(3, 7, dtype=torch.bool)
    mask[0, 2:6] = True  # a prompt of 2 before, padding after
    mask[1, 0:7] = True  # the whole row
    mask[2, 4:5] = True  # one token
    gamma, lam = 0.9, 0.8
    advantages, returns = gae(rewards, values, mask, gamma, lam)
    for row in range(3):
        real = mask[row]
        expected, expected_returns = gae_numpy(
            rewards[row, real].tolist(), values[row, real].tolist(), gamma, lam
        )
        assert advantages[row, real].numpy() == pytest.approx(expected, abs=1e-12)
        assert returns[row, real].numpy() == pytest.approx(expected_returns, abs=1e-12)
        assert not advantages[row, ~real].any() and not returns[row, ~real].any()
    # lambda 1, gamma 1: the advantage is the sum of the rewards to go minus the value.
    advantages, _ = gae(rewards, values, mask, 1.0, 1.0)
    to_go = rewards[1].flip(0).cumsum(0).flip(0)
    assert advantages[1].numpy() == pytest.approx((to_go - values[1]).numpy(), abs=1e-12)


def test_the_clipped_surrogate_by_hand():
    # ratios e^0.5 = 1.65 and e^-0.5 = 0.61 with advantages of both signs, and a masked token.
    old = torch.zeros(1, 5)
    new = torch.tensor([[0.5, 0.5, -0.5, -0.5, 3.0]])
    advantages = torch.tensor([[2.0, -2.0, 2.0, -2.0, 10.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, fraction = clipped_policy_loss(new, old, advantages, mask, clip=0.2)
    r_up, r_down = math.exp(0.5), math.exp(-0.5)
    terms = [
        min(r_up * 2, 1.2 * 2),  # A > 0, ratio above 1 + eps: clipped, no gain past it
        min(r_up * -2, 1.2 * -2),  # A < 0: the unclipped, worse one
        min(r_down * 2, 0.8 * 2),  # A > 0, ratio below 1 - eps: the unclipped, worse one
        min(r_down * -2, 0.8 * -2),  # A < 0, ratio below 1 - eps: clipped
    ]
    assert loss.item() == pytest.approx(-sum(terms) / 4, abs=1e-6)
    assert fraction.item() == 1.0  # all four ratios lie outside [0.8, 1.2]
    # Inside the clip range the loss is the plain policy gradient's -mean(ratio A).
    near = torch.tensor([[0.1, -0.1, 0.0, 0.05, 0.0]])
    loss, fraction = clipped_policy_loss(near, old, advantages, mask, clip=0.2)
    plain = -(near.exp() * advantages * mask).sum() / 4
    assert loss.item() == pytest.approx(plain.item(), abs=1e-6) and fraction.item() == 0.0


def test_the_value_loss_by_hand_clipped_and_not():
    values, old = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0]])
    returns, mask = torch.tensor([[2.0, -1.0]]), torch.ones(1, 2)
    # Unclipped: 1/2 mean((1-2)^2, (0+1)^2) = 0.5.
    assert value_loss(values, old, returns, mask, clip=0).item() == pytest.approx(0.5)
    # Clipped at 0.2: the first value counts as 0.2, (0.2-2)^2 = 3.24 > 1; the second is 1.
    assert value_loss(values, old, returns, mask, clip=0.2).item() == pytest.approx(
        0.5 * (3.24 + 1) / 2
    )


def test_the_rewards_put_the_score_on_the_last_token_and_the_penalty_on_every_one():
    log_probs = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-1.0, -1.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5, 0.0], [-2.0, -1.0, 0.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    rewards, kl = kl_rewards(log_probs, ref, torch.tensor([3.0, -1.0]), mask, beta=0.1)
    assert rewards.tolist()[0] == pytest.approx([0.0, 0.1, 0.0, 3.0])
    assert rewards.tolist()[1] == pytest.approx([-0.1, -1.0, 0.0, 0.0])
    assert kl.tolist() == pytest.approx([-1.0, 1.0])
    assert whiten(torch.tensor([[1.0, 2.0, 3.0, 9.0]]), torch.tensor([[1.0, 1.0, 1.0, 0.0]]))[
        0
    ].tolist() == pytest.approx([-1.2247, 0.0, 1.2247, 0.0], abs=1e-4)


def trainer(shape: str, **changes) -> PPOTrainer:
    policy = tiny_model(shape, seed=0, max_len=24, eos_id=2, decoder_start_id=1, pad_id=0)
    reward = add_reward_head(tiny_model(shape, seed=1, max_len=24), seed=1)
    section = PPOSection(reward_model="x", max_new_tokens=6, **changes)
    assert policy.config.dropout > 0  # in training mode, as a run's model comes: PPO turns it off
    return PPOTrainer(policy.train(), reward.eval(), section, lr=1e-3, seed=0)


@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_the_kl_penalty_is_zero_while_the_policy_is_its_reference(shape):
    ppo = trainer(shape, beta=0.5)
    prompts = [[5, 6, 7, 2], [8, 9, 2], [10, 11, 12, 13, 2]]
    rollouts = ppo.rollouts(prompts)
    assert rollouts.actions.any(-1).all()
    assert torch.equal(rollouts.kl, torch.zeros(3))
    # Every step of a policy that did not move: ratio 1, so nothing is clipped.
    _, stats = ppo.loss(rollouts)
    assert stats["clip_fraction"].item() == 0 and stats["approx_kl"].item() == 0
    # After an update the policy has moved and the penalty is no longer zero.
    ppo.step(prompts)
    assert ppo.rollouts(prompts).kl.abs().sum() > 0


def test_a_reward_model_of_another_shape_or_vocabulary_is_refused():
    policy = tiny_model("decoder")
    section = PPOSection(reward_model="x")
    other = add_reward_head(tiny_model("encoder-decoder"))
    with pytest.raises(AttnkitError, match="train the reward model from the policy's run"):
        PPOTrainer(policy, other, section)
    other = add_reward_head(tiny_model("decoder", vocab_size=50))
    with pytest.raises(AttnkitError, match="another vocabulary"):
        PPOTrainer(policy, other, section)
    with pytest.raises(AttnkitError, match=r"ppo\.clip"):
        PPOSection(clip=1.5)


def reward_model_run(tmp_path, shape: str) -> tuple:
    """A base run of `shape`, and a reward model trained from it on the alphabet pairs."""
    base = tiny_run(tmp_path / "base", shape)
    corpus = write_preference_pairs(tmp_path / "pairs", ALPHABET, train=240)
    config = RunConfig.from_dict(
        {
            "data": {"task": "reward-model", "corpus": str(corpus), "max_tokens": 200},
            "train": {
                "init_from": str(base),
                "out_dir": str(tmp_path / "rm"),
                "steps": 40,
                "lr": 0.01,
                "schedule": "constant",
                "warmup": 0,
                "threads": 1,
                "save_every": 40,
            },
            "eval": {"every": 40, "metric": "reward_accuracy"},
        }
    )
    train(config)
    return base, corpus, tmp_path / "rm"


def ppo_config(tmp_path, base, corpus, rm, steps: int) -> str:
    path = tmp_path / "ppo.toml"
    path.write_text(
        f"""
[data]
task = "ppo"
corpus = "{corpus}"
batch_size = 16

[ppo]
reward_model = "{rm}"
beta = 0.01
max_new_tokens = 5
epochs = 4
minibatches = 2

[train]
init_from = "{base}"
out_dir = "{tmp_path / "ppo"}"
steps = {steps}
lr = 0.003
threads = 1
log_every = 1

[eval]
every = {steps}
metric = "val_reward"
decode_examples = 24
"""
    )
    return str(path)


@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_cli_ppo_raises_the_reward_models_mean_score(tmp_path, shape):
    base, corpus, rm = reward_model_run(tmp_path, shape)
    steps = 30
    assert main(["train", ppo_config(tmp_path, base, corpus, rm, steps)]) == 0
    run = tmp_path / "ppo"
    records = [r for r in RunFolder(run).read_metrics() if "reward" in r]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    first = np.mean([r["reward"] for r in records[:5]])
    last = np.mean([r["reward"] for r in records[-5:]])
    assert last > first + 0.1, (first, last)
    assert all(r["clip_fraction"] <= 1 and r["response_length"] > 0 for r in records)
    # The tuned policy is a plain run folder every command reads, with its value head beside.
    tuned = load_pretrained(run)
    assert tuned.config.shape == shape and (run / VALUE_HEAD_FILE).is_file()
    assert (run / "tokenizer.json").read_text() == (base / "tokenizer.json").read_text()
    assert RunFolder(run).bound_fingerprint() == RunFolder(run).load_tokenizer().fingerprint
    with pytest.raises(AttnkitError, match=r"tuned on preference pairs, .* pass --corpus"):
        read_eval_set(load_run(run))  # its corpus is a folder of pairs, not text to score
    # Its greedy responses to held-out prompts score higher than the base run's.
    evaluation = [r for r in RunFolder(run).read_metrics() if "val_reward" in r][-1]
    reward = load_reward_model(rm)
    start = PPOTrainer(load_pretrained(base), reward, PPOSection(reward_model=str(rm)))
    ids = (
        RunFolder(base)
        .load_tokenizer()
        .encode_batch(
            list(dict.fromkeys(p.prompt for p in _val_pairs(corpus)))[:24],
            add_eos=shape == "encoder-decoder",
        )
    )
    start.section = PPOSection(reward_model=str(rm), max_new_tokens=5)
    assert evaluation["val_reward"] > start.greedy_reward(ids)


def _val_pairs(corpus):
    return read_pairs(corpus / "val.jsonl")


def test_a_ppo_run_is_refused_without_a_reward_model(tmp_path):
    base = tiny_run(tmp_path / "base", "decoder")
    corpus = write_preference_pairs(tmp_path / "pairs", ALPHABET)
    config = RunConfig.load(ppo_config(tmp_path, base, corpus, "", 2))
    with pytest.raises(AttnkitError, match=r"set ppo\.reward_model"):
        train(config)
    config = RunConfig.load(ppo_config(tmp_path, base, corpus, base, 2))
    with pytest.raises(AttnkitError, match="without a reward head"):
        train(config)
    assert not (tmp_path / "ppo").exists()  # refused before anything was written


def _tensors(path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


@pytest.mark.parametrize(
    ("shape", "lora"), [("decoder", False), ("encoder-decoder", False), ("decoder", True)]
)
def test_a_ppo_run_stopped_halfway_and_resumed_ends_as_one_that_ran_through(tmp_path, shape, lora):
    base, corpus, rm = reward_model_run(tmp_path, shape)
    path = ppo_config(tmp_path, base, corpus, rm, 4)
    if lora:  # the reference is the policy without its update; the factors resume apart
        path = RunConfig.load(path, ["lora.rank=4"]).to_toml()
        (tmp_path / "lora.toml").write_text(path)
        path = str(tmp_path / "lora.toml")
    through, halves = tmp_path / "through", tmp_path / "halves"
    train(RunConfig.load(path, [f"train.out_dir={through}"]))
    with pytest.raises(AttnkitError, match=r"no trainer_state\.pt to resume from"):
        train(RunConfig.load(path, [f"train.out_dir={halves}"]), resume=True)
    train(RunConfig.load(path, [f"train.out_dir={halves}", "train.steps=2", "eval.every=1"]))
    # Another start, other PPO settings or a changed reference are refused, the run untouched.
    with pytest.raises(AttnkitError, match="was trained with other ppo"):
        train(RunConfig.load(path, [f"train.out_dir={halves}", "ppo.beta=0.5"]), resume=True)
    weights = base / "model.safetensors"
    original = weights.read_bytes()
    with safe_open(str(weights), "pt") as f:
        metadata = f.metadata()
    moved = {k: v + 0.01 for k, v in load_file(str(weights)).items()}
    save_file(moved, str(weights), metadata=metadata)  # the reference is no longer the start
    with pytest.raises(AttnkitError, match=r"not those .* started from"):
        train(RunConfig.load(path, [f"train.out_dir={halves}"]), resume=True)
    weights.write_bytes(original)
    train(RunConfig.load(path, [f"train.out_dir={halves}"]), resume=True)
    for name in ("model.safetensors", VALUE_HEAD_FILE):
        want, got = _tensors(through / name), _tensors(halves / name)
        assert want.keys() == got.keys()
        for key in want:
            assert torch.equal(want[key], got[key]), (name, key)
    records = [
        [r for r in RunFolder(run).read_metrics() if "reward" in r] for run in (through, halves)
    ]
    assert [r["step"] for r in records[1]] == [1, 2, 3, 4]
    for want, got in zip(*records, strict=True):
        assert {k: v for k, v in want.items() if k != "minutes"} == {
            k: v for k, v in got.items() if k != "minutes"
        }
    state = RunFolder(halves).read_trainer_state()
    assert state["task"] == "ppo" and state["step"] == 4 and state["optimizer"]["state"]
    before = (halves / "metrics.jsonl").read_text()
    with pytest.raises(AttnkitError, match=r"stopped at step 4, past train\.steps 3"):
        train(RunConfig.load(path, [f"train.out_dir={halves}", "train.steps=3"]), resume=True)
    assert (halves / "metrics.jsonl").read_text() == before


def test_with_lora_the_reference_is_the_policy_without_its_update():
    policy = tiny_model("decoder", seed=0, max_len=24, eos_id=2, pad_id=0)
    apply_lora(policy, rank=4, alpha=8.0)
    reward = add_reward_head(tiny_model("decoder", seed=1, max_len=24), seed=1)
    ppo = PPOTrainer(policy, reward, PPOSection(reward_model="x", max_new_tokens=6), lr=1e-2)
    assert ppo.reference is None  # no second copy
    base = {n: w.clone() for n, w in policy.state_dict().items() if "lora" not in n}
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    assert torch.equal(ppo.rollouts(prompts).kl, torch.zeros(3))
    ppo.step(prompts)
    assert ppo.rollouts(prompts).kl.abs().sum() > 0
    assert all(torch.equal(w, policy.state_dict()[n]) for n, w in base.items())
