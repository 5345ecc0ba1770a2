"""A custom gym env end to end on the bundled model, on CPU: rollout -> PPO step -> completions.jsonl.

    python examples/gym_env.py [--steps 1] [--output gym_out]

The env (`capitals`) and a context manager (`last_turn_only`) come from the plugin file
`examples/gym_plugin.py`, loaded exactly as ``textenv rollout --external_plugins`` loads it. Set
``TEXTENV_SMALL=1`` for a smaller run. The same job from the command line:

    textenv train --task gym --dataset rows.jsonl --external_plugins examples/gym_plugin.py --gym_env capitals \\
        --max_turns 2 --ppo_steps 1 --batch_size 4 --mini_batch_size 4 --output_dir gym_out
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from textenv.gym import GymScheduler, GymSource, load_plugins, read_completions
from textenv.training import Settings, StepLog, build_policy, build_trainer, train

PLUGIN = Path(__file__).with_name("gym_plugin.py")
WORDS = ["apple", "river", "green", "seven", "house", "music", "cloud", "tiger"]


def dataset_rows(count: int) -> list[dict]:
    """Rows for the plugin's env; every other one uses the plugin's context manager."""
    rows = []
    for index in range(count):
        row = {"word": WORDS[index % len(WORDS)], "env_config": {"name": "capitals", "latency": 0.05}}
        if index % 2:
            row["ctx_config"] = {"name": "last_turn_only"}
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1, help="PPO steps (default 1)")
    parser.add_argument("--output", default="gym_out", help="folder for completions.jsonl (default gym_out)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    small = os.environ.get("TEXTENV_SMALL") == "1"
    episodes_per_step = 2 if small else 4
    torch.manual_seed(args.seed)

    load_plugins(PLUGIN)  # registers "capitals" and "last_turn_only"
    settings = Settings(
        model="bundled", seed=args.seed, ppo_steps=args.steps, batch_size=episodes_per_step, mini_batch_size=episodes_per_step,
        ppo_epochs=1, learning_rate=1e-5, init_kl_coef=0.2, lora=False, value_head_init_std=0.0,
    )
    model, tokenizer = build_policy(settings)
    trainer = build_trainer(model, tokenizer, settings, name="gym_env")
    scheduler = GymScheduler(
        trainer.model,
        tokenizer,
        max_turns=2,
        loss_scale="default",  # train every reply (ms-swift's server default is "last_round")
        generation_kwargs={"max_new_tokens": 8, "do_sample": True, "temperature": 0.7, "top_k": 0, "top_p": 1.0},
        step_timeout=30,
    )
    completions = Path(args.output) / "completions.jsonl"
    completions.unlink(missing_ok=True)
    episodes = GymSource(scheduler, dataset_rows(episodes_per_step), episodes_per_step, completions_path=completions)
    result = {}

    def report(log: StepLog) -> None:
        for episode in log.batch.episodes:
            replies = [m["content"] for m in episode.messages if m["role"] == "assistant"]
            print(f"[step {log.step}] {episode.env_name} word={episode.trajectory_infos[0]['word']!r} turns={episode.num_turns} "
                  f"reward={episode.total_reward:.1f} finish={episode.finish_reason} replies={replies}")
        result.update(
            step=log.step,
            reward_mean=log.reward_mean,
            trained_tokens=int(sum(int(mask.sum()) for mask in log.batch.masks)),
            kl=log.kl,
            loss=float(log.stats["ppo/loss/total"]),
        )
        print(f"[step {log.step}] PPO: " + " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()))

    train(trainer, episodes, settings.ppo_steps, on_step=report, progress=False)
    records = read_completions(completions)
    print(f"{completions}: {len(records)} lines; first trajectory_infos: {records[0]['trajectory_infos']}")
    return {**result, "completions": str(completions), "lines": len(records)}


if __name__ == "__main__":
    main()
