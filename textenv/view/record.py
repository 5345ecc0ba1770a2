"""`RunRecorder`: a training run writes what `textenv view` shows as it goes, one crash-safe line at a time.

A run directory holds

- `episodes.jsonl`: one line per episode (see `textenv.view.episodes`): every episode a PPO step trained on
  (phase ``"train"``) and the evaluation episodes recorded with `record_episodes`;
- `steps.jsonl`: one line per PPO step: `step`, `reward_mean`, `accuracy`, `kl`, `kl_coef`, `episodes`,
  `tool_calls`, `tool_errors`, `tool_calls_by_name`, `tool_calls_cut`, `kinds` (Gym episodes: per environment kind, the
  episodes, mean reward and accuracy), `episode_seconds`, `ppo_seconds`, `time` (unix),
  and the rollouts' overlap with training (`textenv.training.train(max_staleness=...)`; all 0 in step):
  `wait_seconds` (the trainer waiting for episodes), `pause_seconds` (the servers paused for the weight update),
  `staleness_mean` and `staleness_max` (policy versions between the turns' weights and the trained ones), and on
  vLLM `server_busy_seconds` (since the previous step, time with a turn in flight; `null` on the in-process engine).

Every line is written by `CompletionsLog`: one `os.write` on an `O_APPEND` descriptor, so a crash leaves
whole lines only (a torn last line is skipped by `read_completions`). Each line also has `run`, an id of
the recorder that wrote it: a resumed run appends to the same files, and `textenv view` keeps, for each
step, the episodes of the run that wrote that step last.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from textenv.gym.completions import CompletionsLog
from textenv.view.episodes import Record, episode_record

EPISODES_FILE = "episodes.jsonl"
STEPS_FILE = "steps.jsonl"
COMPLETIONS_FILE = "completions.jsonl"  # a Gym run's rollouts (textenv.gym.GymSource, textenv rollout)
# `accuracy` is the fraction of episodes whose reward reaches the largest reward of the 0/1 tasks: 1.0.
SOLVED_REWARD = 1.0


def step_summary(records: Sequence[Record]) -> Dict[str, Any]:
    """Mean reward, accuracy (the fraction of episodes with reward >= `SOLVED_REWARD`) and tool-call counts
    of one step's episode records.

    Args:
        records (`Sequence[dict]`): the step's episode records (as `episode_record` makes them).

    Returns:
        ``{"reward_mean", "accuracy", "episodes", "tool_calls", "tool_errors", "tool_calls_by_name", "tool_calls_cut"}``
        (`tool_calls_cut`: model turns that reached `max_new_tokens` inside a tool call), and `kinds` when the
        records name their environment kind (`kind_summaries`)
        (`reward_mean` and `accuracy` are `None` without a scored episode).
    """
    rewards = [record["reward"] for record in records if record.get("reward") is not None]
    calls = [call for record in records for call in record.get("tool_calls") or []]
    return {
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "accuracy": sum(reward >= SOLVED_REWARD for reward in rewards) / len(rewards) if rewards else None,
        "episodes": len(records),
        "tool_calls": len(calls),
        "tool_errors": sum(bool(call.get("error")) for call in calls),
        "tool_calls_by_name": dict(Counter(call.get("name") or "" for call in calls)),
        "tool_calls_cut": sum(int(record.get("tool_calls_cut") or 0) for record in records),
        **kind_summaries(records),
    }


def kind_summaries(records: Sequence[Record]) -> Dict[str, Any]:
    """``{"kinds": {kind: {"episodes", "reward_mean", "accuracy"}}}`` for the records that name their environment
    kind (Gym front end episodes), or ``{}`` when none does."""
    by_kind: Dict[str, List[float]] = {}
    for record in records:
        if record.get("env_kind") is not None:
            rewards = by_kind.setdefault(str(record["env_kind"]), [])
            if record.get("reward") is not None:
                rewards.append(record["reward"])
    if not by_kind:
        return {}
    counts = Counter(str(record["env_kind"]) for record in records if record.get("env_kind") is not None)
    return {"kinds": {kind: {"episodes": counts[kind], "reward_mean": sum(rewards) / len(rewards) if rewards else None,
                             "accuracy": sum(reward >= SOLVED_REWARD for reward in rewards) / len(rewards) if rewards else None}
                      for kind, rewards in by_kind.items()}}


def set_aside_previous_run(run_dir: Union[str, Path]) -> Optional[Path]:
    """Move a finished run's `episodes.jsonl`, `steps.jsonl` and `completions.jsonl` out of the way (into
    `run_dir/previous/<time>/`), so that a new, unrelated run in the same directory starts empty while nothing
    already written is lost. A resumed run must not call this: it appends to the files.

    Returns:
        The folder they were moved to, or `None` when there was nothing to move.
    """
    run_dir = Path(run_dir)
    existing = [run_dir / name for name in (EPISODES_FILE, STEPS_FILE, COMPLETIONS_FILE) if (run_dir / name).exists()]
    if not existing:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder, index = run_dir / "previous" / stamp, 0
    while folder.exists():  # another run set aside within the same second
        index += 1
        folder = run_dir / "previous" / f"{stamp}-{index}"
    folder.mkdir(parents=True)
    for path in existing:
        path.rename(folder / path.name)
    return folder


class RunRecorder:
    """Appends a run's episodes and steps to `run_dir/episodes.jsonl` and `run_dir/steps.jsonl`.

    Args:
        run_dir (`str` or `Path`): the run directory (created; existing files are appended to).
        tokenizer (*optional*): spells each token of the episodes (`convert_ids_to_tokens`) for the token view.
        fsync (`bool`, defaults to `False`): also ask the OS to put each line on disk.

    Use it as a context manager, or call `close()`.
    """

    def __init__(self, run_dir: Union[str, Path], tokenizer=None, fsync: bool = False):
        self.run_dir = Path(run_dir)
        self.tokenizer = tokenizer
        self.run_id = uuid.uuid4().hex[:12]
        self._episodes = CompletionsLog(self.run_dir / EPISODES_FILE, fsync=fsync)
        self._steps = CompletionsLog(self.run_dir / STEPS_FILE, fsync=fsync)

    def record_episodes(self, episodes: Iterable[Any], rewards: Optional[Sequence[float]] = None, step: int = 0, phase: str = "eval") -> List[Record]:
        """Append episodes to `episodes.jsonl`, e.g. an evaluation's.

        Args:
            episodes (`Iterable`): `TextHistory`s or `GymEpisode`s.
            rewards (`Sequence[float]`, *optional*): one per episode (default: each episode's own reward).
            step (`int`, defaults to 0): the training step they belong to (e.g. the steps done so far).
            phase (`str`, defaults to ``"eval"``): what they are, e.g. ``"eval-before"`` or ``"eval-after"``.

        Returns:
            The records written.
        """
        episodes = list(episodes)
        if rewards is not None and len(rewards) != len(episodes):
            raise ValueError(f"record_episodes: {len(rewards)} rewards for {len(episodes)} episodes; pass one reward per episode.")
        records = []
        for index, episode in enumerate(episodes):
            reward = None if rewards is None else float(rewards[index])
            record = {**episode_record(episode, step, phase, reward, self.tokenizer), "index": index, "run": self.run_id}
            self._episodes.write(record)
            records.append(record)
        return records

    def record_step(self, log) -> Dict[str, Any]:
        """Append a training step (PPO or GRPO): its episodes (phase ``"train"``, scored as trained) and its `steps.jsonl` line.

        Args:
            log (`StepLog`): the step, as `textenv.training.train` reports it.

        Returns:
            The `steps.jsonl` line.
        """
        batch = log.batch
        scores = [float(score) for score in batch.scores]
        episodes = list(batch.episodes)  # a source may leave them out: then only the step line is written
        records = self.record_episodes(episodes, scores if len(scores) == len(episodes) else None, step=log.step, phase="train")
        line = {
            "step": log.step,
            **step_summary(records),
            "reward_mean": log.reward_mean,
            "accuracy": sum(score >= SOLVED_REWARD for score in scores) / len(scores) if scores else None,
            "episodes": len(scores),
            "kl": None if math.isnan(log.kl) else log.kl,  # GRPO without a reference has none (JSON has no NaN)
            "kl_coef": log.kl_coef,
            "episode_seconds": log.episode_seconds,
            "ppo_seconds": log.ppo_seconds,
            "wait_seconds": getattr(log, "wait_seconds", 0.0),
            "pause_seconds": getattr(log, "pause_seconds", 0.0),
            "staleness_mean": getattr(log, "staleness_mean", 0.0),
            "staleness_max": getattr(log, "staleness_max", 0),
            "server_busy_seconds": getattr(log, "server_busy_seconds", None),
            "time": time.time(),
            "run": self.run_id,
        }
        self._steps.write(line)
        return line

    def close(self) -> None:
        """Close both files."""
        self._episodes.close()
        self._steps.close()

    def __enter__(self) -> "RunRecorder":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
