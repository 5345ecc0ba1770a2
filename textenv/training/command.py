"""`textenv train`: one training command for TextEnvironment tasks and Gym datasets, parsed the TRL way.

Options are three dataclasses read by TRL's `TrlParser` (an `HfArgumentParser`): `PPOConfig` (the PPO
settings), `RunArguments` (the task, the data, the run) and TRL's `ModelConfig` (the model, its dtype and
the LoRA flags, turned into adapters by TRL's `get_peft_config`). ``--config run.yaml`` reads any of them
from a file; command-line values override the file. Every option takes both spellings, ``--max_turns`` and
``--max-turns``.

    textenv train --task calculator --model_name_or_path bundled --use_peft --lora_r 16 --steps 320 --batch_size 16
    textenv train --task gym --dataset rows.jsonl --gym_env tool_env --report_to tensorboard --save_steps 5
    textenv train --config run.yaml --learning_rate 1e-5
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from accelerate.utils import gather_object

from textenv.logs import setup_logging

logger = logging.getLogger(__name__)

TASKS = ("calculator", "gym")


@dataclass
class RunArguments:
    """The run: which task, which data, where it goes (the model and PPO settings have their own classes)."""

    task: str = field(default="calculator", metadata={"help": "'calculator' (TextEnvironment with the Calculator tool) or 'gym' (rows of --dataset)"})
    dataset: Optional[str] = field(default=None, metadata={"help": "gym rows: a .jsonl / .json file, a datasets folder (save_to_disk) or a hub dataset id"})
    gym_env: Optional[str] = field(default=None, metadata={"help": "env name for rows without env_config.name"})
    external_plugins: Optional[str] = field(default=None, metadata={"help": "plugin .py file registering envs"})
    loss_scale: str = field(default="all", metadata={"help": "gym: last_round, default or all"})
    tool_format: str = field(default="tags", metadata={"help": "calculator: 'tags' or 'json' tool calls"})
    device: str = field(default="cpu", metadata={"help": "torch device of the policy (cpu, cuda, ...)"})
    max_turns: int = field(default=3, metadata={"help": "model turns per episode"})
    max_new_tokens: int = field(default=24, metadata={"help": "tokens per model turn"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the rollouts"})
    output_dir: str = field(default="outputs/train", metadata={"help": "checkpoints, logs, completions.jsonl and the final model"})
    save_steps: int = field(default=0, metadata={"help": "save a checkpoint every N PPO steps (0: only the final model)"})
    resume_from_checkpoint: Optional[str] = field(
        default=None, metadata={"help": "a checkpoint-N folder, or 'latest' for the newest complete one under --output_dir"}
    )
    report_to: str = field(default="none", metadata={"help": "tracker: none, tensorboard, wandb or trackio"})
    push_to_hub: bool = field(default=False, metadata={"help": "upload the final model, tokenizer and a model card"})
    hub_model_id: Optional[str] = field(default=None, metadata={"help": "the hub repository (default: the output folder's name)"})
    hub_token: Optional[str] = field(default=None, metadata={"help": "hub token (default: the logged-in one)"})
    hub_private_repo: Optional[bool] = field(default=None, metadata={"help": "create the repository private"})
    log_level: str = field(default="info", metadata={"help": "debug, info, warning, error (other ranks: warning)"})
    no_progress: bool = field(default=False, metadata={"help": "no progress bars"})


# Short names users know from the other commands and the examples.
ALIASES = {"--model": "--model_name_or_path", "--lora": "--use_peft", "--lora-rank": "--lora_r", "--lora_rank": "--lora_r"}


def with_aliases(argv: Optional[Sequence[str]]) -> list[str]:
    """The command line with `ALIASES` replaced by the option they stand for (``--model=x`` too)."""
    import sys

    replaced = []
    for argument in list(sys.argv[1:] if argv is None else argv):
        name, sep, value = argument.partition("=")
        replaced.append(ALIASES.get(name, name) + sep + value if name in ALIASES else argument)
    return replaced


def load_dataset_rows(source: str) -> list[dict]:
    """Rows of a `.jsonl` / `.json` file, a `datasets` folder (`save_to_disk`) or a hub dataset id (its
    `train` split)."""
    import datasets

    from textenv.gym import load_rows

    path = Path(source)
    if path.is_file():
        return load_rows(path)
    if path.is_dir():
        loaded = datasets.load_from_disk(str(path))
        return load_rows(loaded["train"] if isinstance(loaded, datasets.DatasetDict) else loaded)
    return load_rows(datasets.load_dataset(source, split="train"))


def parse(argv: Optional[Sequence[str]] = None) -> tuple[Any, RunArguments, Any]:
    """`(ppo_config, run_arguments, model_config)` from the command line (and ``--config`` file).

    Raises:
        ValueError: an unknown task or tracker, or a gym task without a dataset.
    """
    from trl import ModelConfig, TrlParser

    from textenv.ppo import PPOConfig

    parser = TrlParser((PPOConfig, RunArguments, ModelConfig), prog="textenv train", description=__doc__)
    ppo_config, run, model = parser.parse_args_and_config(with_aliases(argv))
    if run.task not in TASKS:
        raise ValueError(f"--task must be one of {list(TASKS)}, got {run.task!r}.")
    if run.task == "gym" and not run.dataset:
        raise ValueError("--task gym needs --dataset (a .jsonl file of rows).")
    if run.report_to not in ("none", "tensorboard", "wandb", "trackio"):
        raise ValueError(f"--report_to must be none, tensorboard, wandb or trackio, got {run.report_to!r}.")
    if run.report_to != "none":
        ppo_config.log_with = run.report_to
        ppo_config.project_kwargs = {**ppo_config.project_kwargs, "logging_dir": str(Path(run.output_dir) / "runs")}
    return ppo_config, run, model


def build(ppo_config, run: RunArguments, model_config):
    """The trainer and the episode source of a run."""
    from trl import get_peft_config

    from textenv.training.evaluation import SAMPLING_KWARGS
    from textenv.training.policy import load_policy
    from textenv.training.settings import trainer_without_dataset

    policy, tokenizer = load_policy(
        model_config.model_name_or_path or "bundled",
        device=run.device,
        peft_config=get_peft_config(model_config),
        dtype=model_config.dtype,
        seed=ppo_config.seed,
    )
    trainer = trainer_without_dataset(ppo_config, policy, tokenizer)
    generation_kwargs = {**SAMPLING_KWARGS, "temperature": run.temperature, "max_new_tokens": run.max_new_tokens}
    return trainer, _episode_source(trainer, tokenizer, run, ppo_config, generation_kwargs)


def _episode_source(trainer, tokenizer, run: RunArguments, ppo_config, generation_kwargs: dict):
    if run.task == "calculator":
        from textenv.training.calculator import build_calculator_environment, calculator_task_batches
        from textenv.training.settings import Settings
        from textenv.training.sources import TextEnvironmentSource

        settings = Settings(max_turns=run.max_turns, max_new_tokens=run.max_new_tokens, tool_format=run.tool_format)
        env = build_calculator_environment(trainer.model, tokenizer, settings)
        env.generation_kwargs = generation_kwargs

        # Every process draws its own tasks (its own stream), so the ranks train on different episodes.
        seed = ppo_config.seed + trainer.accelerator.process_index
        return TextEnvironmentSource(env, calculator_task_batches(ppo_config.batch_size, seed, plain=run.tool_format == "json"))
    from textenv.gym import GymScheduler, GymSource, load_plugins

    load_plugins(run.external_plugins)
    scheduler = GymScheduler(
        trainer.model, tokenizer, gym_env=run.gym_env, max_turns=run.max_turns, loss_scale=run.loss_scale, generation_kwargs=generation_kwargs
    )
    accelerator = trainer.accelerator
    rows = load_dataset_rows(run.dataset)[accelerator.process_index :: accelerator.num_processes]  # each process its share
    completions = Path(run.output_dir) / "completions.jsonl" if accelerator.is_main_process else None
    return GymSource(scheduler, rows, ppo_config.batch_size, completions_path=completions)


def resume(trainer, episodes, run: RunArguments) -> int:
    """Load `run.resume_from_checkpoint` into the trainer and the episode source; returns the steps done.

    Raises:
        FileNotFoundError: no complete checkpoint there (or, for ``latest``, under `run.output_dir`).
    """
    from textenv.ppo.checkpoint import find_latest_checkpoint, load_checkpoint

    path = run.resume_from_checkpoint
    if path == "latest":
        path = find_latest_checkpoint(run.output_dir)
        if path is None:
            raise FileNotFoundError(f"--resume_from_checkpoint latest: no complete checkpoint-N folder under {run.output_dir}.")
    state = load_checkpoint(trainer, path)
    sources = state.get("run", {}).get("sources", [])
    rank = trainer.accelerator.process_index
    if len(sources) != trainer.accelerator.num_processes:
        raise ValueError(f"{path} was saved by {len(sources)} processes; resume it with as many (now {trainer.accelerator.num_processes}).")
    episodes.load_state_dict(sources[rank])
    logger.info(f"resumed from {path} after {state['step']} steps")
    return int(state["step"])


def push(folder: Path, ppo_config, run: RunArguments, model_config, rewards: list[float]) -> str:
    """Upload the final model folder with a model card (see `textenv.training.hub`)."""
    from dataclasses import asdict

    from textenv.training.hub import push_folder

    repo_id = run.hub_model_id or Path(run.output_dir).resolve().name
    summary = {
        "base_model": model_config.model_name_or_path or "bundled",
        "task_description": f"the {run.task} task" + (f" ({run.dataset})" if run.dataset else ""),
        "steps": ppo_config.total_ppo_epochs,
        "batch_size": ppo_config.batch_size,
        "learning_rate": ppo_config.learning_rate,
        "adapters": f"LoRA r={model_config.lora_r}" if model_config.use_peft else "none (all weights)",
        "rewards": [round(reward, 3) for reward in rewards[-5:]],
        "options": {"run": {k: v for k, v in asdict(run).items() if k != "hub_token"}, "model": asdict(model_config)},
    }
    url = push_folder(folder, repo_id, summary, token=run.hub_token, private=run.hub_private_repo)
    logger.info(f"pushed to the hub: {url}")
    return url


def check_ranks_agree(trainer) -> Optional[str]:
    """The SHA-256 of the trained weights, checked to be the same on every process (`None`, and nothing
    hashed, on a single process).

    Raises:
        RuntimeError: the processes hold different weights (they did not train in lockstep).
    """
    import hashlib

    import torch

    if trainer.accelerator.num_processes == 1:
        return None

    digest = hashlib.sha256()
    for name, parameter in sorted(trainer.accelerator.unwrap_model(trainer.model).named_parameters()):
        if parameter.requires_grad:
            digest.update(name.encode())
            digest.update(parameter.detach().to("cpu", torch.float32).numpy().tobytes())
    hashes = gather_object([digest.hexdigest()])
    if len(set(hashes)) != 1:
        raise RuntimeError(f"the processes hold different weights after training: {hashes}")
    logger.info(f"trained weights identical on {len(hashes)} process(es): sha256 {hashes[0][:16]}")
    return hashes[0]


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Run `textenv train` and return its figures (steps run, mean rewards, the output folder, the step logs)."""
    from textenv.ppo.checkpoint import checkpoint_name, save_checkpoint
    from textenv.training.loop import train

    ppo_config, run, model_config = parse(argv)
    setup_logging(run.log_level)
    trainer, episodes = build(ppo_config, run, model_config)
    output_dir = Path(run.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    start_step = resume(trainer, episodes, run) if run.resume_from_checkpoint else 0

    def on_step(log) -> None:
        logger.info(f"step {log.step + 1}: reward_mean={log.reward_mean:.3f} kl={log.kl:.4f}")
        if run.save_steps and (log.step + 1) % run.save_steps == 0:
            sources = gather_object([episodes.state_dict()])  # one per process, in rank order
            folder = save_checkpoint(trainer, output_dir / checkpoint_name(log.step + 1), {"sources": sources})
            logger.info(f"checkpoint: {folder}")

    logs = train(trainer, episodes, ppo_config.total_ppo_epochs, on_step=on_step, progress=not run.no_progress, start_step=start_step)
    check_ranks_agree(trainer)
    trainer.save_pretrained(str(output_dir / "final"))  # every process calls it; the main one writes
    rewards = [log.reward_mean for log in logs]
    if run.push_to_hub and trainer.accelerator.is_main_process:
        push(output_dir / "final", ppo_config, run, model_config, rewards)
    logger.info(f"steps={len(logs)} reward_means={[round(reward, 3) for reward in rewards]} output_dir={output_dir}")
    return {"steps": len(logs), "reward_means": rewards, "output_dir": str(output_dir), "logs": logs}
