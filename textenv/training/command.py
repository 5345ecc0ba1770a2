"""`textenv train`: one training command for TextEnvironment tasks, Gym datasets and verifiers environments, with
PPO or GRPO, parsed the TRL way.

Options are dataclasses read by TRL's `TrlParser` through `textenv.parsing.OptionParser`: `PPOConfig` (the
PPO settings; with ``--algorithm grpo`` its seed, steps, batch sizes, learning rate, gradient clipping and
tracking are GRPO's too), `AlgorithmArguments` (``--algorithm ppo|grpo``, GRPO's settings, ``--max_staleness``),
`EpisodeArguments` (how episodes are played, shared with `textenv rollout`, the demo and the examples),
`GymArguments` (the dataset, env, TRL environment class or verifiers environment of ``--task gym|verifiers``),
`RunArguments` (the task, the run's length, checkpoints, tracker, hub), TRL's `ModelConfig` (the model, its
dtype and the LoRA flags, turned into adapters by TRL's `get_peft_config`) and `CommandArguments` (logging).
``--config run.yaml`` reads any of them from a file; command-line values override the file. Every option takes
both spellings, ``--max_turns`` and ``--max-turns``.

Tasks: calculator (TextEnvironment with the Calculator tool), gym (rows of --dataset played by a Gym env or a TRL
environment class), verifiers (a verifiers environment, --env_id). Algorithms: ppo (the default), grpo.
The run's shape defaults to the demo's: 20 steps of 16 episodes, in mini-batches of at most 4 (the largest of 4,
3, 2, 1 that divides the batch), one PPO epoch, a new value head starting near 0 and, with --use_peft, adapters on
the seven projections of every decoder layer the demo adapts (q, k, v, o, gate, up, down); legacy `PPOConfig`'s
(128 episodes, 20000 of them, 4 epochs) apply in Python only. The learning rate and the KL control stay legacy
`PPOConfig`'s (for all weights; the demo trains LoRA adapters at 2e-4).

    textenv train --task calculator --model_name_or_path bundled --use_peft --lora_r 16 --lora_layers 8 --ppo_steps 20 --batch_size 16
    textenv train --task calculator --algorithm grpo --num_generations 8 --use_peft --lora_r 16 --learning_rate 2e-4
    textenv train --task gym --dataset examples/data/guess_number.jsonl --external_plugins examples/gym_plugin.py \\
        --gym_env guess_number --max_turns 4 --max_new_tokens 8 --loss_scale default
    textenv train --task gym --dataset examples/data/counter.jsonl --environment_factory examples/counter_env.py:CounterEnv \\
        --algorithm grpo --num_generations 8 --use_peft --lora_r 16 --learning_rate 2e-4
    PYTHONPATH=examples/verifiers textenv train --task verifiers --env_id arithmetic --algorithm grpo --num_generations 8
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from accelerate.utils import gather_object

from textenv.logs import setup_logging
from textenv.options import (DEFAULT_BATCH_SIZE, DEFAULT_PPO_EPOCHS, DEFAULT_TRAINING_STEPS, DEFAULT_VALUE_HEAD_INIT_STD, CommandArguments,
                             EpisodeArguments, GymArguments, default_mini_batch_size)
from textenv.parsing import OptionParser, settings_phase

logger = logging.getLogger(__name__)

TASKS = ("calculator", "gym", "verifiers", "openenv")


@dataclass
class RunArguments:
    """The run: which task and where it goes (episodes, data, model and PPO settings have their own classes)."""

    task: str = field(
        default="calculator",
        metadata={"help": "calculator (TextEnvironment with the Calculator tool), gym (rows of --dataset played by --gym_env, "
                          "--environment_factory or --mcp_server), verifiers (the verifiers environment --env_id) or openenv (rows of "
                          "--dataset played by the OpenEnv environment --env_id)"},
    )
    ppo_steps: Optional[int] = field(
        default=None,
        metadata={"help": f"training steps, PPO or GRPO, as in the demo and the examples (default {DEFAULT_TRAINING_STEPS}, unless --steps, "
                          "legacy PPOConfig's count of training episodes, is given: then steps / batch_size)"},
    )
    output_dir: str = field(
        default="outputs/train", metadata={"help": "checkpoints, logs, episodes.jsonl and steps.jsonl (textenv view), completions.jsonl and the final model"}
    )
    lora_layers: int = field(
        default=0,
        metadata={"help": "with --use_peft: the adapters on the top N decoder layers only (peft's layers_to_transform); 0: every "
                          "layer, as TRL. The demo and the examples use 8 (of the bundled model's 30)"},
    )
    value_head_init_std: float = field(
        default=DEFAULT_VALUE_HEAD_INIT_STD,
        metadata={"help": "PPO: a new value head's weights ~ N(0, this), so its first values are about 0, as in the demo and the examples "
                          "(0: PyTorch's default initialisation, legacy's, whose values differ by about 1 from token to token)"},
    )
    save_steps: int = field(default=0, metadata={"help": "save a checkpoint every N PPO steps (0: only the final model)"})
    resume_from_checkpoint: Optional[str] = field(
        default=None, metadata={"help": "a checkpoint-N folder, or 'latest' for the newest complete one under --output_dir"}
    )
    report_to: str = field(default="none", metadata={"help": "tracker: none, tensorboard, wandb or trackio"})
    push_to_hub: bool = field(default=False, metadata={"help": "upload the final model, tokenizer and a model card"})
    hub_model_id: Optional[str] = field(default=None, metadata={"help": "the hub repository (default: the output folder's name)"})
    hub_token: Optional[str] = field(default=None, metadata={"help": "hub token (default: the logged-in one)"})
    hub_private_repo: Optional[bool] = field(default=None, metadata={"help": "create the repository private"})


@dataclass
class TrainOptions:
    """Everything `textenv train` reads, one object per option class."""

    ppo: Any
    algorithm: Any
    episode: EpisodeArguments
    gym: GymArguments
    run: RunArguments
    model: Any
    command: CommandArguments
    given: frozenset = frozenset()  # the option names given on the command line or in --config
    grpo: Any = None  # the GRPOConfig of --algorithm grpo, built from the options above


def parse(argv: Optional[Sequence[str]] = None) -> TrainOptions:
    """The options of the command line (and its ``--config`` file), checked together; nothing is loaded.

    Raises:
        ValueError: an unknown option, task or tracker, a gym task without a dataset, or values that do not go
            together (each message names the options and the fix).
    """
    from trl import ModelConfig

    from textenv.grpo import AlgorithmArguments, GRPOConfig
    from textenv.grpo.config import OFF_POLICY_SETTINGS
    from textenv.ppo import PPOConfig
    from textenv.training.policy import LORA_TARGET_MODULES

    classes = (PPOConfig, AlgorithmArguments, EpisodeArguments, GymArguments, RunArguments, ModelConfig, CommandArguments)
    parser = OptionParser(classes, prog="textenv train", description=__doc__, derive=_run_length_and_mini_batch,
                          defaults={"loss_scale": "all", "batch_size": DEFAULT_BATCH_SIZE, "ppo_epochs": DEFAULT_PPO_EPOCHS,
                                    "lora_target_modules": list(LORA_TARGET_MODULES)})
    options = TrainOptions(*parser.parse(argv), given=parser.given)
    run = options.run
    if run.task not in TASKS:
        raise ValueError(f"--task must be one of {', '.join(TASKS)}, got {run.task!r}.")
    if run.task in ("gym", "openenv") and not options.gym.dataset:
        raise ValueError(f"--task {run.task} needs --dataset (a .jsonl file of rows, a datasets folder or a hub dataset id).")
    options.gym.check_task(run.task)
    if run.report_to not in ("none", "tensorboard", "wandb", "trackio"):
        raise ValueError(f"--report_to must be none, tensorboard, wandb or trackio, got {run.report_to!r}.")
    if run.report_to != "none":
        options.ppo.log_with = run.report_to
        options.ppo.project_kwargs = {**options.ppo.project_kwargs, "logging_dir": str(Path(run.output_dir) / "runs")}
    if options.episode.mixed_precision:
        options.ppo.accelerator_kwargs = {**options.ppo.accelerator_kwargs, "mixed_precision": options.episode.mixed_precision}
    if run.lora_layers and not options.model.use_peft:
        raise ValueError(f"--lora_layers {run.lora_layers} places LoRA adapters: add --use_peft (or --lora), or leave --lora_layers out.")
    if run.lora_layers < 0:
        raise ValueError(f"--lora_layers must be >= 0 (0: every layer), got {run.lora_layers}.")
    options.algorithm.check_batch_size(options.ppo.batch_size)
    if options.algorithm.algorithm == "grpo":
        given = options.given.intersection((*OFF_POLICY_SETTINGS, "vllm_importance_sampling_cap"))
        options.grpo = GRPOConfig.from_ppo_config(options.ppo, options.algorithm.grpo_arguments(), options.episode.temperature, given)
    return options


def _run_length_and_mini_batch(values: argparse.Namespace, given: frozenset) -> None:
    """The command's defaults that follow from the options given: ``--ppo_steps`` 20 unless ``--steps`` is given
    (``--steps`` = ``ppo_steps x batch_size`` otherwise), and a mini-batch that divides the batch."""
    if {"steps", "ppo_steps"} <= given:
        raise ValueError("--steps (legacy PPOConfig's count of training episodes) and --ppo_steps (training steps) both set the run's length: give one.")
    if "steps" not in given:
        values.steps = (values.ppo_steps or DEFAULT_TRAINING_STEPS) * values.batch_size
    if not given & {"mini_batch_size", "forward_batch_size"}:
        values.mini_batch_size = default_mini_batch_size(values.batch_size, values.gradient_accumulation_steps)


def build(options: TrainOptions):
    """The trainer and the episode source of a run. What the options name is loaded first (plugins, rows,
    environment classes), then the policy.

    Raises:
        FileNotFoundError, ValueError: a file, dataset, env or model the options name cannot be loaded (settings
            errors: the `textenv` console says them in one line).
    """
    from trl import get_peft_config

    from textenv.training.policy import load_policy
    from textenv.grpo import GRPOTrainer
    from textenv.training.settings import trainer_without_dataset

    rows = options.gym.prepare() if options.run.task != "calculator" else None
    grpo = options.grpo is not None
    policy, tokenizer = load_policy(
        options.model.model_name_or_path or "bundled",
        device=options.episode.device,
        value_head=not grpo,
        peft_config=get_peft_config(options.model),
        lora_layers=options.run.lora_layers,
        value_head_init_std=options.run.value_head_init_std,
        dtype=options.model.dtype,
        seed=options.ppo.seed,
    )
    if grpo:
        trainer = GRPOTrainer(options.grpo, policy, tokenizer=tokenizer)
    else:
        trainer = trainer_without_dataset(options.ppo, policy, tokenizer)
    return trainer, _episode_source(trainer, tokenizer, options, rows)


def _episode_source(trainer, tokenizer, options: TrainOptions, rows: Optional[list]):
    accelerator = trainer.accelerator
    episode, batch_size = options.episode, options.ppo.batch_size
    if options.run.task == "calculator":
        from textenv.training.calculator import build_calculator_environment, calculator_task_batches
        from textenv.training.sources import TextEnvironmentSource

        env = build_calculator_environment(trainer.model, tokenizer, episode)
        # Every process draws its own tasks (its own stream), so the ranks train on different episodes.
        seed = options.ppo.seed + accelerator.process_index
        return TextEnvironmentSource(env, calculator_task_batches(batch_size, seed, plain=episode.tool_format == "json"))
    from textenv.gym import GymSource

    scheduler = options.gym.scheduler(trainer.model, tokenizer, episode)
    rows = rows[accelerator.process_index :: accelerator.num_processes]  # each process its share
    completions = Path(options.run.output_dir) / "completions.jsonl" if accelerator.is_main_process else None
    return GymSource(scheduler, rows, batch_size, completions_path=completions)


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
    if sources[rank] is not None:
        episodes.load_state_dict(sources[rank])
    ahead = int(state.get("run", {}).get("episodes_ahead", 0))
    discarded = f"; {ahead} episodes that were played ahead of training when it was saved are discarded (their tasks are played again)" if ahead else ""
    logger.info(f"resumed from {path} after {state['step']} steps{discarded}")
    return int(state["step"])


def push(folder: Path, options: TrainOptions, rewards: list[float]) -> str:
    """Upload the final model folder with a model card (see `textenv.training.hub`)."""
    from dataclasses import asdict

    from textenv.training.hub import push_folder

    ppo_config, run, model_config = options.ppo, options.run, options.model

    repo_id = run.hub_model_id or Path(run.output_dir).resolve().name
    summary = {
        "base_model": model_config.model_name_or_path or "bundled",
        "algorithm": options.algorithm.algorithm.upper(),
        "task_description": f"the {run.task} task" + (f" ({options.gym.dataset or options.gym.env_id})" if run.task != "calculator" else ""),
        "steps": ppo_config.total_ppo_epochs,
        "batch_size": ppo_config.batch_size,
        "learning_rate": ppo_config.learning_rate,
        "adapters": (f"LoRA r={model_config.lora_r}" + (f" on the top {run.lora_layers} layers" if run.lora_layers else "")
                     if model_config.use_peft else "none (all weights)"),
        "rewards": [round(reward, 3) for reward in rewards[-5:]],
        "options": {
            "run": {key: value for key, value in asdict(run).items() if key != "hub_token"},
            "algorithm": asdict(options.algorithm),
            "episode": asdict(options.episode),
            "gym": asdict(options.gym) if run.task in ("gym", "openenv") else None,
            "model": asdict(model_config),
        },
    }
    url = push_folder(folder, repo_id, summary, token=run.hub_token, private=run.hub_private_repo)
    logger.info(f"pushed to the hub: {url}")
    return url


def warn_if_fsdp_ignored(accelerator) -> bool:
    """Warn (and return `True`) when `accelerate launch` was given an FSDP config but the processes run
    another way: on a machine without GPUs accelerate runs an FSDP config as plain CPU data parallelism,
    so nothing is sharded."""
    import os

    from accelerate.utils import DistributedType

    asked = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true")
    if not asked or accelerator.distributed_type == DistributedType.FSDP:
        return False
    logger.warning(
        f"accelerate was launched with an FSDP config, but runs as {accelerator.distributed_type.value} here "
        "(FSDP needs GPUs): the model is replicated on every process, not sharded."
    )
    return True


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
    with settings_phase():
        options = parse(argv)
    try:
        return _train(options)
    finally:
        options.gym.close()  # the environment servers it keeps for the run (--task openenv)


def _train(options: TrainOptions) -> dict:
    from textenv.ppo.checkpoint import checkpoint_name, save_checkpoint
    from textenv.training.loop import kind_rewards, train

    with settings_phase():
        run = options.run
        setup_logging(options.command.log_level)
        trainer, episodes = build(options)
        warn_if_fsdp_ignored(trainer.accelerator)
        output_dir = Path(run.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        start_step = resume(trainer, episodes, run) if run.resume_from_checkpoint else 0
    if not run.resume_from_checkpoint and trainer.accelerator.is_main_process:
        from textenv.view import set_aside_previous_run

        previous = set_aside_previous_run(output_dir)  # a new run starts its files empty; a resumed one appends
        if previous is not None:
            logger.info(f"the previous run's episodes, steps and completions in {output_dir} moved to {previous}")

    def on_step(log) -> None:
        synced = "" if log.weight_sync_seconds is None else f" weight_sync={log.weight_sync_seconds:.2f}s"
        kinds = "".join(f" {kind}={reward:.3f}" for kind, reward in kind_rewards(log.batch).items())
        logger.info(f"step {log.step + 1}: reward_mean={log.reward_mean:.3f}{kinds} kl={log.kl:.4f}{synced}")
        if run.save_steps and (log.step + 1) % run.save_steps == 0:
            sources = gather_object([log.source_state])  # one per process, in rank order, as of this step's batch
            extra = {"sources": sources, "episodes_ahead": log.episodes_ahead}
            folder = save_checkpoint(trainer, output_dir / checkpoint_name(log.step + 1), extra)
            ahead = f" ({log.episodes_ahead} episodes played ahead are discarded if it is resumed)" if log.episodes_ahead else ""
            logger.info(f"checkpoint: {folder}{ahead}")

    steps = options.ppo.total_ppo_epochs
    run_dir = output_dir if trainer.accelerator.is_main_process else None  # episodes.jsonl, steps.jsonl: rank 0's
    logs = train(trainer, episodes, steps, on_step=on_step, progress=not options.command.no_progress, start_step=start_step, run_dir=run_dir,
                 max_staleness=options.algorithm.max_staleness)
    check_ranks_agree(trainer)
    trainer.save_pretrained(str(output_dir / "final"))  # every process calls it; the main one writes
    trainer.accelerator.end_training()
    rewards = [log.reward_mean for log in logs]
    if run.push_to_hub and trainer.accelerator.is_main_process:
        push(output_dir / "final", options, rewards)
    logger.info(f"steps={len(logs)} reward_means={[round(reward, 3) for reward in rewards]} output_dir={output_dir}")
    return {"steps": len(logs), "reward_means": rewards, "output_dir": str(output_dir), "logs": logs}
