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

With ``max_staleness=K >= 1`` (rollouts on vLLM) step 1 plays ahead: a rollout thread plays the next batches
while the trainer steps, no turn more than K policy versions older than the weights it is trained into, and
after each step the new weights go to the servers between turns (`textenv.training.overlap`). ``K=0`` (the
default) is the loop above, one step after the other, exactly.

Printing, plotting and argument parsing belong to the callers (`textenv.demo`, `textenv.cli`, the examples).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from textenv.training.overlap import EpisodePipeline, staleness
from textenv.training.sources import EpisodeBatch, EpisodeSource

logger = logging.getLogger(__name__)


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
            server(s) (`None` on the in-process engine, which reads them live): before this step's episodes, or
            with ``max_staleness >= 1`` after this step; also in `stats` as `time/weight_sync`.
        stats (`dict`): every statistic the trainer's `step` returned.
        batch (`EpisodeBatch`): the episodes trained on, with their tokens, scores, masks and texts.
        staleness_mean / staleness_max (`float` / `int`): over the batch's model turns, how many policy versions
            older than the weights trained (this step's) the weights that sampled each turn were (0 in step).
        wait_seconds (`float`): time the trainer waited for the batch played ahead (0 with ``max_staleness=0``,
            where `episode_seconds` is the time playing it).
        pause_seconds (`float`): with ``max_staleness >= 1``, time the servers served no turns for the weight
            update after this step (waiting for the turns in flight, then the sync); 0 otherwise.
        server_busy_seconds (`float`, *optional*): on vLLM, wall time since the previous step ended during which
            the servers had a turn in flight (the rest of the step's wall time they idled); `None` otherwise.
        episodes_dropped (`int`): episodes played and never trained on (counted when the loop stops).
        episodes_ahead (`int`): episodes played or in flight for later steps when this step's batch was handed
            over (a checkpoint saved now discards them on resume).
        source_state (`dict`, *optional*): the episode source's `state_dict()` as of this step's batch (what a
            checkpoint of this step resumes from).
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
    staleness_mean: float = 0.0
    staleness_max: int = 0
    wait_seconds: float = 0.0
    pause_seconds: float = 0.0
    server_busy_seconds: float | None = None
    episodes_dropped: int = 0
    episodes_ahead: int = 0
    source_state: dict | None = field(default=None, repr=False)


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
    max_staleness: int = 0,
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
        max_staleness (`int`, defaults to 0): 0 plays each step's episodes before the step, with its weights.
            K >= 1 plays the next batches while the trainer steps (vLLM engine only): no turn is trained into
            weights more than K versions newer than those that sampled it. Pair it with the trainer's
            ``vllm_importance_sampling_correction`` (a warning says so otherwise).

    Raises:
        ValueError: `max_staleness` is negative, or at least 1 with an engine that cannot play beside training.

    Returns:
        One `StepLog` per step that ran.
    """
    from tqdm.auto import tqdm

    logs: list[StepLog] = []
    started = time.perf_counter()
    group_size = _group_size(trainer)
    if max_staleness:
        _warn_if_uncorrected(trainer, max_staleness)
    bar = tqdm(range(start_step, steps), desc="GRPO" if group_size else "PPO", unit="step", disable=not progress, initial=start_step, total=steps)
    pipeline = EpisodePipeline(episodes, steps, start_step=start_step, max_staleness=max_staleness, num_generations=group_size,
                               batch_size=getattr(trainer.config, "batch_size", 0))
    busy_before = pipeline.server_busy_seconds()
    with _recorder(run_dir, trainer) as recorder, pipeline:
        for step in bar:
            if deadline is not None and logs:
                mean_step_seconds = (time.perf_counter() - started) / len(logs)
                if time.perf_counter() + mean_step_seconds > deadline:
                    break

            trainer.model.eval()  # the PPO step leaves the policy in train mode
            arrival = pipeline.next_batch(step)
            batch = arrival.batch
            ppo_started = time.perf_counter()
            stats = trainer.step(batch.queries, batch.responses, batch.scores, batch.masks, **_step_arguments(trainer, batch))
            ppo_seconds = time.perf_counter() - ppo_started
            published = pipeline.publish(step + 1)
            log = StepLog(
                step=step,
                reward_mean=batch.reward_mean,
                kl=float(stats["objective/kl"]),
                kl_coef=float(stats["objective/kl_coef"]),
                episode_seconds=arrival.episode_seconds,
                ppo_seconds=ppo_seconds,
                stats=stats,
                batch=batch,
                weight_sync_seconds=arrival.weight_sync_seconds if published is None else published[1],
                wait_seconds=arrival.wait_seconds,
                pause_seconds=0.0 if published is None else sum(published),
                episodes_ahead=arrival.episodes_ahead,
                source_state=arrival.source_state,
            )
            log.staleness_mean, log.staleness_max = staleness(batch, step)
            busy = pipeline.server_busy_seconds()
            log.server_busy_seconds, busy_before = (None if busy is None else busy - busy_before), busy
            _add_loop_stats(stats, log, max_staleness)
            trainer.log_stats(stats, {"query": batch.query_texts, "response": batch.response_texts}, batch.scores)
            if trainer.config.log_with == "tensorboard":
                trainer.accelerator.log({"episodes": batch.markdown_table()}, step=trainer.current_step)
            logs.append(log)
            bar.set_postfix(reward=f"{log.reward_mean:.2f}", kl=f"{log.kl:.2f}")  # nan: GRPO without a reference
            if recorder is not None:
                recorder.record_step(log)
            if on_step is not None:
                on_step(log)
    if logs:
        logs[-1].episodes_dropped = pipeline.episodes_dropped
    bar.close()
    return logs


def kind_rewards(batch) -> dict:
    """``{kind: mean score}`` of a batch whose episodes played several environment kinds (`GymEpisode.env_kind`);
    ``{}`` when they played one (or are not Gym episodes)."""
    by_kind: dict = {}
    for episode, score in zip(batch.episodes, batch.scores):
        kind = getattr(episode, "env_kind", None)
        if kind is not None:
            by_kind.setdefault(kind, []).append(float(score))
    return {kind: sum(scores) / len(scores) for kind, scores in by_kind.items()} if len(by_kind) > 1 else {}


def _add_loop_stats(stats: dict, log: StepLog, max_staleness: int) -> None:
    """The loop's own figures among the trainer's statistics: the weight sync (when one ran), each environment
    kind's mean reward when a batch played several (``env/<kind>/reward_mean``) and, with rollouts played ahead,
    the staleness and the waits (in step they are 0, and the statistics stay the trainer's)."""
    if log.weight_sync_seconds is not None:
        stats["time/weight_sync"] = log.weight_sync_seconds
    stats.update({f"env/{kind}/reward_mean": reward for kind, reward in kind_rewards(log.batch).items()})
    if max_staleness:
        stats.update({
            "rollout/staleness_mean": log.staleness_mean,
            "rollout/staleness_max": log.staleness_max,
            "time/trainer_wait": log.wait_seconds,
            "time/server_pause": log.pause_seconds,
            "time/server_busy": log.server_busy_seconds,
            "rollout/episodes_ahead": log.episodes_ahead,
        })


def _warn_if_uncorrected(trainer, max_staleness: int) -> None:
    if not getattr(trainer.config, "vllm_importance_sampling_correction", False):
        logger.warning(
            f"max_staleness={max_staleness}: episodes may be sampled by weights up to {max_staleness} steps older than those "
            "they train, and vllm_importance_sampling_correction is off, so the loss treats them as on-policy. Turn it on "
            "(--vllm_importance_sampling_correction) to weight each token by the trainer's over the sampler's probability."
        )


def _group_size(trainer) -> int | None:
    """GRPO's ``num_generations`` (episodes per group), `None` for PPO."""
    from textenv.grpo import GRPOTrainer

    return trainer.config.num_generations if isinstance(trainer, GRPOTrainer) else None


def _step_arguments(trainer, batch: EpisodeBatch) -> dict[str, Any]:
    """`trainer.step`'s arguments beyond the four: GRPO's ``truncated``; the engine's log-probabilities of the
    responses (``rollout_logprobs``) when the config asks for the importance-sampling correction."""
    arguments: dict[str, Any] = {"truncated": batch.truncated()} if _group_size(trainer) else {}
    if getattr(trainer.config, "vllm_importance_sampling_correction", False):
        arguments["rollout_logprobs"] = batch.rollout_logprobs()
    return arguments


def _recorder(run_dir: str | Path | None, trainer) -> Any:
    """A `RunRecorder` of `run_dir` (closed when the loop ends), or nothing for `None`."""
    if run_dir is None:
        return contextlib.nullcontext()
    from textenv.view.record import RunRecorder

    return RunRecorder(run_dir, tokenizer=getattr(trainer, "tokenizer", None))
