"""Teach a language model to use a calculator with PPO (the legacy TRL `calculator.py` example).

Tasks are `What is a op b?` with a, b in [0, 50) and op in + - *; the model sees a 2-shot prompt, calls
`<request><Calculator>a op b<call>`, reads the result and answers `Result=N<submit>`. The reward is 1 for
an exact result and 0 otherwise. Each PPO step plays `--batch-size` episodes with TextEnvironment
(sampling at temperature 1) and optimises on them with `PPOTrainer.step`.

The defaults are small enough for a CPU (the bundled SmolLM2-135M-Instruct with LoRA adapters); for a
GPU-size run, e.g.:

    python examples/calculator.py --device cuda --ppo_steps 100 --batch_size 128 --mini_batch_size 32 \\
        --generation_batch_size 128 --threads 0

Statistics go to tensorboard (`tensorboard --logdir runs/calculator`).
"""

from __future__ import annotations

import time

from textenv import options, training
from textenv.logs import setup_logging
from textenv.reporting import peak_memory_mb
from textenv.tasks import calculator as task


def parse(argv: list[str] | None = None) -> tuple:
    """`(settings, example options, command options)`; the defaults make a CPU-sized run of the bundled model
    (``--eval_tasks``: held-out tasks evaluated, sampled, after training, 0 = none)."""
    classes = (training.Settings, options.ExampleArguments, options.CommandArguments)
    return options.parse_options(classes, argv, description=__doc__, defaults={"ppo_steps": 4, "eval_tasks": 50})


def main(argv: list[str] | None = None) -> dict:
    settings, args, command = parse(argv)
    setup_logging(command.log_level)
    started = time.perf_counter()
    training.seed_everything(settings.seed, settings.threads)

    model, tokenizer = training.build_policy(settings)
    env = training.build_calculator_environment(model, tokenizer, settings)
    ppo_trainer = training.build_trainer(model, tokenizer, settings, log_dir=args.log_dir)
    eval_queries, eval_answers = task.generate_tasks(settings.eval_tasks, seed=settings.eval_seed)
    task_batches = training.calculator_task_batches(settings.batch_size, settings.seed, exclude=eval_queries)

    episodes = training.TextEnvironmentSource(env, task_batches)
    logs = training.train(ppo_trainer, episodes, settings.ppo_steps, progress=not command.no_progress, max_staleness=settings.max_staleness)
    ppo_trainer.accelerator.end_training()

    summary = {
        "steps": len(logs),
        "episodes": len(logs) * settings.batch_size,
        "first_reward": logs[0].reward_mean if logs else float("nan"),
        "last_reward": logs[-1].reward_mean if logs else float("nan"),
        "final_kl": logs[-1].kl if logs else float("nan"),
    }
    if settings.eval_tasks > 0:
        summary["held_out_sampled_accuracy"] = training.evaluate(env, eval_queries, eval_answers, sample=True).accuracy
    if args.save_dir:
        ppo_trainer.save_pretrained(args.save_dir)
    summary["seconds"] = time.perf_counter() - started
    summary["peak_memory_mb"] = peak_memory_mb()
    print_summary(summary, settings, args)
    return summary


def print_summary(summary: dict, settings: training.Settings, args: options.ExampleArguments) -> None:
    print(f"\n=== calculator {settings.algorithm.upper()} summary ===")
    print(f"steps: {summary['steps']} ({summary['episodes']} episodes), model: {settings.model}, lora: {settings.lora}, lr: {settings.learning_rate}")
    print(f"training reward: first step {summary['first_reward']:.2f}, last step {summary['last_reward']:.2f}; final KL {summary['final_kl']:.3f}")
    if "held_out_sampled_accuracy" in summary:
        print(f"held-out accuracy (sampled, {settings.eval_tasks} tasks): {summary['held_out_sampled_accuracy']:.1%}")
    print(f"wall time: {summary['seconds']:.1f} s, peak memory: {summary['peak_memory_mb']:.0f} MiB")
    print(f"tensorboard logs: {args.log_dir}" + (f"; model saved to {args.save_dir}" if args.save_dir else ""))


if __name__ == "__main__":
    main()
