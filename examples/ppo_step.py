"""The legacy TRL tool-use loop in a few lines: TextEnvironment plays calculator episodes, PPOTrainer.step
learns from them, and the statistics are printed. With ``--algorithm grpo`` GRPOTrainer.step learns from the
same episodes instead, in groups of ``--num_generations`` episodes of one task (no value head).

    python examples/ppo_step.py                 # bundled SmolLM2-135M-Instruct on CPU, 3 small steps
    python examples/ppo_step.py --ppo_steps 20 --batch_size 16 --mini_batch_size 4
    python examples/ppo_step.py --algorithm grpo --num_generations 4 --batch_size 8

Each step of textenv's training loop (`textenv.training.train`, the loop of the demo, the CLI and every
example): `env.run(queries, answers=answers)` returns `(queries, responses, masks, rewards, histories)`;
the masks are 0 on the calculator's output so only the model's own tokens are trained on;
`trainer.step(queries, responses, rewards, masks)` runs PPO on them; `on_step` prints the statistics.
"""


import warnings
from dataclasses import dataclass, field

import torch

from textenv import PPOConfig, PPOTrainer, TextEnvironment
from textenv.grpo import AlgorithmArguments, GRPOConfig, GRPOTrainer
from textenv.models import load_bundled_model
from textenv.options import EpisodeArguments, parse_options
from textenv.tasks import calculator as task
from textenv.tools import Calculator
from textenv.training import StepLog, TextEnvironmentSource, train

SHOWN_STATS = {
    "ppo": (
        "env/reward_mean", "objective/kl", "objective/kl_coef", "objective/entropy", "ppo/loss/policy",
        "ppo/loss/value", "ppo/policy/clipfrac", "ppo/val/var_explained", "ppo/mean_non_score_reward",
        "time/ppo/forward_pass", "time/ppo/optimize_step", "time/ppo/total",
    ),
    "grpo": (
        "env/reward_mean", "objective/entropy", "grpo/loss/policy", "grpo/advantages/abs_mean", "grpo/frac_reward_zero_std",
        "grpo/clip_ratio/region_mean", "tokens/trained", "time/grpo/optimise", "time/grpo/total",
    ),
}


@dataclass
class StepArguments:
    ppo_steps: int = field(default=3, metadata={"help": "PPO steps"})
    threads: int = field(default=0, metadata={"help": "torch CPU threads, 0 = torch default"})
    show_episode: bool = field(default=False, metadata={"help": "print the first episode of every step"})


def parse(argv: list[str] | None = None) -> tuple[PPOConfig, AlgorithmArguments, EpisodeArguments, StepArguments]:
    """Legacy `PPOConfig` options, the algorithm, the episode options every textenv command shares, and this
    script's own."""
    defaults = {"batch_size": 4, "mini_batch_size": 2, "ppo_epochs": 1, "max_turns": 2, "num_generations": 4}
    classes = (PPOConfig, AlgorithmArguments, EpisodeArguments, StepArguments)
    return parse_options(classes, argv, description=__doc__, defaults=defaults)


def main(argv: list[str] | None = None) -> list[dict]:
    config, algorithm, episode, args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    grpo = algorithm.algorithm == "grpo"
    model, tokenizer = load_bundled_model(value_head=not grpo)
    config.accelerator_kwargs = {**config.accelerator_kwargs, "cpu": episode.device == "cpu"}
    if grpo:
        trainer = GRPOTrainer(GRPOConfig.from_ppo_config(config, algorithm.grpo_arguments(), episode.temperature), model, tokenizer=tokenizer)
    else:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No dataset is provided")  # the loop feeds batches itself
            trainer = PPOTrainer(config, model, tokenizer=tokenizer)
    env = TextEnvironment(
        trainer.accelerator.unwrap_model(trainer.model),
        tokenizer,
        {"Calculator": Calculator()},
        task.exact_match_reward,
        task.PROMPT,
        max_turns=episode.max_turns,
        generation_kwargs={**episode.generation_kwargs(), "pad_token_id": tokenizer.pad_token_id},
    )

    def task_batches():
        for step in range(args.ppo_steps):
            yield task.generate_tasks(config.batch_size, seed=config.seed * 1000 + step)

    def show(log: StepLog) -> None:
        print(f"step {log.step + 1}/{args.ppo_steps}  episodes {log.episode_seconds:.1f}s  {algorithm.algorithm.upper()} {log.ppo_seconds:.1f}s")
        for key in SHOWN_STATS[algorithm.algorithm]:
            value = log.reward_mean if key == "env/reward_mean" else log.stats[key]
            print(f"  {key:28s} {float(value): .4f}")
        if args.show_episode:
            print(log.batch.response_texts[0])

    # Each step of `train`: env.run(queries, answers=answers) -> trainer.step(queries, responses, rewards, masks)
    # (GRPO: each task of the batch's first 1/num_generations played num_generations times).
    logs = train(trainer, TextEnvironmentSource(env, task_batches()), args.ppo_steps, on_step=show, progress=False,
                 max_staleness=algorithm.max_staleness)
    return [{**log.stats, "env/reward_mean": log.reward_mean} for log in logs]

if __name__ == "__main__":
    main()
