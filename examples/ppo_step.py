"""The legacy TRL tool-use loop in a few lines: TextEnvironment plays calculator episodes, PPOTrainer.step
learns from them, and the statistics are printed.

    python examples/ppo_step.py                 # bundled SmolLM2-135M-Instruct on CPU, 3 small steps
    python examples/ppo_step.py --steps 20 --batch-size 16 --mini-batch-size 4

Each step of textenv's training loop (`textenv.training.train`, the loop of the demo, the CLI and every
example): `env.run(queries, answers=answers)` returns `(queries, responses, masks, rewards, histories)`;
the masks are 0 on the calculator's output so only the model's own tokens are trained on;
`trainer.step(queries, responses, rewards, masks)` runs PPO on them; `on_step` prints the statistics.
"""

from __future__ import annotations

import argparse
import warnings

import torch

from textenv import PPOConfig, PPOTrainer, TextEnvironment
from textenv.models import load_bundled_model
from textenv.tasks import calculator as task
from textenv.tools import Calculator
from textenv.training import StepLog, TextEnvironmentSource, train

SHOWN_STATS = (
    "env/reward_mean", "objective/kl", "objective/kl_coef", "objective/entropy", "ppo/loss/policy",
    "ppo/loss/value", "ppo/policy/clipfrac", "ppo/val/var_explained", "ppo/mean_non_score_reward",
    "time/ppo/forward_pass", "time/ppo/optimize_step", "time/ppo/total",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="PPO steps (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=4, help="episodes per step (default: %(default)s)")
    parser.add_argument("--mini-batch-size", type=int, default=2, help="(default: %(default)s)")
    parser.add_argument("--ppo-epochs", type=int, default=1, help="(default: %(default)s)")
    parser.add_argument("--lr", type=float, default=1.41e-5, help="learning rate (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="tokens per model turn (default: %(default)s)")
    parser.add_argument("--max-turns", type=int, default=2, help="model turns per episode (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads, 0 = torch default")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    parser.add_argument("--show-episode", action="store_true", help="print the first episode of every step")
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_bundled_model(value_head=True)
    config = PPOConfig(
        batch_size=args.batch_size, mini_batch_size=args.mini_batch_size, ppo_epochs=args.ppo_epochs,
        learning_rate=args.lr, seed=args.seed, accelerator_kwargs={"cpu": args.device == "cpu"},
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")  # the loop feeds batches itself
        trainer = PPOTrainer(config, model, tokenizer=tokenizer)
    env = TextEnvironment(
        trainer.accelerator.unwrap_model(trainer.model),
        tokenizer,
        {"Calculator": Calculator()},
        task.exact_match_reward,
        task.PROMPT,
        max_turns=args.max_turns,
        generation_kwargs={
            "do_sample": True, "top_k": 0, "top_p": 1.0, "max_new_tokens": args.max_new_tokens,
            "pad_token_id": tokenizer.pad_token_id,
        },
    )
    def task_batches():
        for step in range(args.steps):
            yield task.generate_tasks(args.batch_size, seed=args.seed * 1000 + step)

    def show(log: StepLog) -> None:
        print(f"step {log.step + 1}/{args.steps}  episodes {log.episode_seconds:.1f}s  PPO {log.ppo_seconds:.1f}s")
        for key in SHOWN_STATS:
            value = log.reward_mean if key == "env/reward_mean" else log.stats[key]
            print(f"  {key:28s} {float(value): .4f}")
        if args.show_episode:
            print(log.batch.response_texts[0])

    # Each step of `train`: env.run(queries, answers=answers) -> trainer.step(queries, responses, rewards, masks).
    logs = train(trainer, TextEnvironmentSource(env, task_batches()), args.steps, on_step=show, progress=False)
    return [{**log.stats, "env/reward_mean": log.reward_mean} for log in logs]

if __name__ == "__main__":
    main()
