"""The one training loop of the demo, the CLI and the examples.

Every step, top to bottom, with a `PPOTrainer` (legacy PPO, the default) or a `GRPOTrainer`:

1. the episode source plays a batch of episodes with the policy (in eval mode) and scores them; for GRPO in
   whole groups (``collect(step, num_generations=G)``: G episodes of each task);
2. the trainer's `step` optimises on the query tokens, response tokens, scores and masks (PPO, with
   ``PPOConfig.vllm_importance_sampling_correction``: and the engine's log-probabilities of the responses;
   GRPO: and which episodes a limit truncated);
3. `PPOTrainer.log_stats` sends the step's statistics to the trainer's trackers (tensorboard, wandb), and
   the episodes go there as a table (wandb: `game_log`, as in legacy TRL; tensorboard: a text `episodes`);
4. a `StepLog` records the step; with `run_dir`, a `textenv.view.RunRecorder` appends the step's episodes to
   `run_dir/episodes.jsonl` and its figures to `run_dir/steps.jsonl` (what `textenv view` shows);
5. `on_step(log)` is called with it.

Printing, plotting and argument parsing belong to the callers (`textenv.demo`, `textenv.cli`, the examples).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from textenv.training.sources import EpisodeBatch, EpisodeSource


@dataclass
class StepLog:
    """What one training step did.

    Attributes:
        step (`int`): the step, counted from 0.
        reward_mean (`float`): mean score of the step's episodes.
        kl (`float`): `objective/kl`, the KL of the policy to the reference (NaN for GRPO with ``beta=0``: no
            reference).
        kl_coef (`float`): `objective/kl_coef`, the KL penalty's weight in this step (GRPO: ``beta``).
        episode_seconds (`float`): wall time of playing the episodes.
        ppo_seconds (`float`): wall time of the trainer's `step` (PPO or GRPO).
        weight_sync_seconds (`float`, *optional*): wall time of sending the policy's weights to the vLLM
            server(s) before this step's episodes (`None` on the in-process engine, which reads them live);
            also in `stats` as `time/weight_sync`.
        stats (`dict`): every statistic the trainer's `step` returned.
        batch (`EpisodeBatch`): the episodes trained on, with their tokens, scores, masks and texts.
    """

    step: int
    reward_mean: float
    kl: float
    kl_coef: float
    episode_seconds: float
    ppo_seconds: float
    stats: dict[str, Any] = field(repr=False)
    batch: EpisodeBatch = field(repr=False)
    weight_sync_seconds: float | None = None


def train(
    trainer,
    episodes: EpisodeSource,
    steps: int,
    *,
    on_step: Callable[[StepLog], None] | None = None,
    deadline: float | None = None,
    progress: bool = True,
    start_step: int = 0,
    run_dir: str | Path | None = None,
) -> list[StepLog]:
    """Run `steps` training steps on episodes from `episodes`.

    Args:
        trainer (`PPOTrainer` or `GRPOTrainer`): optimises the policy that `episodes` plays with.
        episodes (`EpisodeSource`): `collect(step)` plays each step's episodes, e.g. a
            `TextEnvironmentSource` or a `textenv.gym.training.GymSource`.
        steps (`int`): steps to run.
        on_step (`Callable[[StepLog], None]`, *optional*): called after every step with its `StepLog`.
        deadline (`float`, *optional*): a `time.perf_counter()` value; no step is started that would, at the
            mean speed of the steps so far, end after it (the first step always runs). `None`: run all `steps`.
        progress (`bool`, defaults to `True`): show a tqdm progress bar with the reward and the KL.
        start_step (`int`, defaults to 0): the first step to run (a resumed run's steps already done).
        run_dir (`str` or `Path`, *optional*): append every step's episodes and figures to
            `run_dir/episodes.jsonl` and `run_dir/steps.jsonl`, crash-safe, for `textenv view` (see
            `textenv.view.RunRecorder`). `None` (default): write nothing.

    Returns:
        One `StepLog` per step that ran.
    """
    from tqdm.auto import tqdm

    logs: list[StepLog] = []
    started = time.perf_counter()
    group_size = _group_size(trainer)
    bar = tqdm(range(start_step, steps), desc="GRPO" if group_size else "PPO", unit="step", disable=not progress, initial=start_step, total=steps)
    with _recorder(run_dir, trainer) as recorder:
        for step in bar:
            if deadline is not None and logs:
                mean_step_seconds = (time.perf_counter() - started) / len(logs)
                if time.perf_counter() + mean_step_seconds > deadline:
                    break

            trainer.model.eval()  # the PPO step leaves the policy in train mode
            episodes_started = time.perf_counter()
            syncs_before = _sync_seconds(episodes)
            batch = episodes.collect(step, num_generations=group_size) if group_size else episodes.collect(step)
            weight_sync_seconds = None if syncs_before is None else sum(_sync_seconds(episodes)[len(syncs_before):])
            ppo_started = time.perf_counter()
            stats = trainer.step(batch.queries, batch.responses, batch.scores, batch.masks, **_step_arguments(trainer, batch))
            ppo_seconds = time.perf_counter() - ppo_started
            if weight_sync_seconds is not None:
                stats["time/weight_sync"] = weight_sync_seconds
            trainer.log_stats(stats, {"query": batch.query_texts, "response": batch.response_texts}, batch.scores)
            if trainer.config.log_with == "tensorboard":
                trainer.accelerator.log({"episodes": batch.markdown_table()}, step=trainer.current_step)

            log = StepLog(
                step=step,
                reward_mean=batch.reward_mean,
                kl=float(stats["objective/kl"]),
                kl_coef=float(stats["objective/kl_coef"]),
                episode_seconds=ppo_started - episodes_started,
                ppo_seconds=ppo_seconds,
                stats=stats,
                batch=batch,
                weight_sync_seconds=weight_sync_seconds,
            )
            logs.append(log)
            bar.set_postfix(reward=f"{log.reward_mean:.2f}", kl=f"{log.kl:.2f}")  # nan: GRPO without a reference
            if recorder is not None:
                recorder.record_step(log)
            if on_step is not None:
                on_step(log)
    bar.close()
    return logs


def _group_size(trainer) -> int | None:
    """GRPO's ``num_generations`` (episodes per group), `None` for PPO."""
    from textenv.grpo import GRPOTrainer

    return trainer.config.num_generations if isinstance(trainer, GRPOTrainer) else None


def _step_arguments(trainer, batch: EpisodeBatch) -> dict[str, Any]:
    """`trainer.step`'s arguments beyond the four: GRPO's ``truncated``; PPO's ``rollout_logprobs`` when its
    config asks for the importance-sampling correction."""
    if _group_size(trainer):
        return {"truncated": batch.truncated()}
    if getattr(trainer.config, "vllm_importance_sampling_correction", False):
        return {"rollout_logprobs": batch.rollout_logprobs()}
    return {}


def _sync_seconds(episodes: EpisodeSource) -> list[float] | None:
    """The seconds of every weight sync so far of the engine `episodes` plays on (`None`: it never syncs)."""
    front_end = getattr(episodes, "env", None) or getattr(episodes, "scheduler", None)
    seconds = getattr(getattr(front_end, "engine", None), "sync_seconds", None)
    return list(seconds) if seconds is not None else None


def _recorder(run_dir: str | Path | None, trainer) -> Any:
    """A `RunRecorder` of `run_dir` (closed when the loop ends), or nothing for `None`."""
    if run_dir is None:
        return contextlib.nullcontext()
    from textenv.view.record import RunRecorder

    return RunRecorder(run_dir, tokenizer=getattr(trainer, "tokenizer", None))
