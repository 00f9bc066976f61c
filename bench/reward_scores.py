"""A reward model's mean score of runs' greedy translations, the val_reward of PPO for any run.

What a PPO run records as `val_reward`, for runs that were not tuned by PPO too (the
supervised model, DPO, REINFORCE).

    python -m bench reward-scores --reward-model runs/rlhf/reward_model \\
        --pairs runs/rlhf/pairs runs/rlhf/supervised_s0 runs/rlhf/dpo_s0 runs/rlhf/ppo_s0

The prompts are the first --prompts distinct sources of the pairs folder's validation split
(`val.jsonl`), as the `ppo` task reads them (`PPOTrainer.prompts`), with the
`multi30k_de_en_ppo` recipe's settings; each run answers them greedily, at most 64 new tokens,
and the reward model scores the answers
(`PPOTrainer.greedy_reward`). A run scored here that is a PPO run's last weights gives that
run's last `val_reward` again, to the digit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from attnkit import recipes
from attnkit.train.ppo_task import PPOTrainer
from attnkit.train.reward_model import load_reward_model
from attnkit.train.run_config import RunConfig
from attnkit.train.run_model import run_model
from attnkit.train.run_tokenizer import run_tokenizer
from bench.harness import opening


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench reward-scores", description=__doc__.splitlines()[0]
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folders of translation models")
    parser.add_argument("--reward-model", type=Path, required=True, help="a reward-model run")
    parser.add_argument("--pairs", type=Path, required=True, help="the folder of pairs")
    parser.add_argument("--prompts", type=int, default=300, help="validation prompts answered")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    opening(f"{args.threads} thread(s), {args.prompts} validation prompts of {args.pairs}")
    reward_model = load_reward_model(args.reward_model)
    base = RunConfig.load(
        recipes.path("multi30k_de_en_ppo"),
        [f"data.corpus={args.pairs}", f"ppo.reward_model={args.reward_model}"],
    )
    scores = {}
    for run in args.runs:
        config = dataclasses.replace(
            base, train=dataclasses.replace(base.train, init_from=str(run))
        )
        tokenizer = run_tokenizer(config, ())
        policy = run_model(config, tokenizer)
        ppo = PPOTrainer(policy, reward_model, config.ppo, lr=config.train.lr)
        prompts = ppo.prompts(config, tokenizer, config.data.valid_split)
        scores[str(run)] = ppo.greedy_reward(prompts[: args.prompts])
        print(f"{run}: {scores[str(run)]:.4f}", flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(scores, indent=2) + "\n")


if __name__ == "__main__":
    main()
