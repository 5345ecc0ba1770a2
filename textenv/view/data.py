"""Reading what `textenv view` shows: a run directory, an `episodes.jsonl` or a `completions.jsonl`.

A run directory holds `episodes.jsonl` and `steps.jsonl` (written by `train(run_dir=...)` and `textenv train`),
and/or `completions.jsonl` (written by Gym rollouts: `textenv rollout`, `textenv train --task gym`). With both,
the `completions.jsonl` lines that `episodes.jsonl` lacks (by `trajectory_id`: the Gym episodes that failed or
were not trained on) are added with phase ``"rollout"``. A resumed run writes its steps again: each step's
training episodes are those of the run that wrote the step last (see `latest_attempts`). Without `steps.jsonl`, the steps are summarised from the
episodes (phases ``"train"`` and ``"rollout"``; no KL or timings then).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Union

from textenv.gym.completions import read_completions
from textenv.view.episodes import Record, completion_line_record
from textenv.view.record import COMPLETIONS_FILE, EPISODES_FILE, STEPS_FILE, step_summary

TRAINING_PHASES = ("train", "rollout")
PATH_HELP = (
    "a run directory written by `train(run_dir=...)` or `textenv train` (episodes.jsonl, steps.jsonl) or by "
    "`textenv rollout` (completions.jsonl), or one such .jsonl file"
)


@dataclass
class RunData:
    """Everything `textenv view` shows of a run.

    Attributes:
        episodes (`list[dict]`): episode records (see `textenv.view.episodes`), in the order written.
        steps (`list[dict]`): one `steps.jsonl`-style line per step, by step.
        sources (`list[str]`): the files read.
    """

    episodes: List[Record] = field(default_factory=list)
    steps: List[Dict[str, Any]] = field(default_factory=list)
    sources: List[str] = field(default_factory=list)


def load_run(path: Union[str, Path]) -> RunData:
    """Read a run directory or one `episodes.jsonl` / `completions.jsonl` file.

    Args:
        path (`str` or `Path`): the run directory or the file.

    Returns:
        A `RunData`.

    Raises:
        FileNotFoundError: `path` does not exist, or is a directory with none of the files.
        ValueError: `path` is a file holding neither episode records nor completions.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"path {str(path)!r} does not exist; pass {PATH_HELP}.")
    if path.is_file():
        return _load_file(path)
    names = [name for name in (EPISODES_FILE, STEPS_FILE, COMPLETIONS_FILE) if (path / name).is_file()]
    if not names:
        raise FileNotFoundError(f"path {str(path)!r} holds none of {EPISODES_FILE}, {STEPS_FILE}, {COMPLETIONS_FILE}; pass {PATH_HELP}.")
    records = read_completions(path / EPISODES_FILE) if EPISODES_FILE in names else []
    episodes = latest_attempts(records)
    if COMPLETIONS_FILE in names:
        known = {record.get("trajectory_id") for record in records if record.get("trajectory_id")}  # stale attempts' too
        episodes = merge_completions(episodes, read_completions(path / COMPLETIONS_FILE), known)
    steps = latest_steps(read_completions(path / STEPS_FILE)) if STEPS_FILE in names else []
    return RunData(episodes, steps or summarise_steps(episodes), [str(path / name) for name in names])


def _load_file(path: Path) -> RunData:
    lines = read_completions(path)
    if lines and all("segments" in line for line in lines):
        episodes = latest_attempts(lines)
    elif lines and all("messages" in line for line in lines):
        episodes = [completion_line_record(line) for line in lines]
    else:
        raise ValueError(f"path {str(path)!r} holds no episodes (lines with 'segments', as in {EPISODES_FILE}, or 'messages', as in {COMPLETIONS_FILE}); pass {PATH_HELP}.")
    return RunData(episodes, summarise_steps(episodes), [str(path)])


def latest_attempts(records: Sequence[Record]) -> List[Record]:
    """The records without those of a step that a later run (a resumed one) wrote again: for each step's
    training episodes, only those of the run (`run` id) that wrote the step last are kept."""
    last_run = {record.get("step"): record.get("run") for record in records if record.get("phase") == "train"}
    return [record for record in records if record.get("phase") != "train" or record.get("run") == last_run[record.get("step")]]


def latest_steps(lines: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One line per step, the last written (a resumed run writes a step again), ordered by step."""
    by_step = {line["step"]: line for line in lines if "step" in line}
    return [by_step[step] for step in sorted(by_step)]


def merge_completions(episodes: List[Record], lines: Sequence[Dict[str, Any]], known: Optional[Set[str]] = None) -> List[Record]:
    """`episodes` plus the `completions.jsonl` lines whose `trajectory_id` is not `known` (default: the ids of
    `episodes`)."""
    known = {record.get("trajectory_id") for record in episodes if record.get("trajectory_id")} if known is None else known
    return [*episodes, *(completion_line_record(line) for line in lines if not line.get("trajectory_id") or line["trajectory_id"] not in known)]


def summarise_steps(episodes: Sequence[Record], phases: Sequence[str] = TRAINING_PHASES) -> List[Dict[str, Any]]:
    """A `steps.jsonl`-style line per step from the episodes of `phases` (no `kl` or timings)."""
    by_step: Dict[int, List[Record]] = {}
    for record in episodes:
        if record.get("phase") in phases:
            by_step.setdefault(int(record.get("step") or 0), []).append(record)
    return [{"step": step, **step_summary(by_step[step]), "kl": None} for step in sorted(by_step)]


def phase_summaries(episodes: Sequence[Record], key: str = "phase") -> List[Dict[str, Any]]:
    """Per value of `key` (``"phase"``, or ``"env_kind"`` for the environment kinds), in first-seen order: the
    episode count, mean reward, accuracy and tool calls."""
    groups: Dict[Optional[str], List[Record]] = {}
    for record in episodes:
        groups.setdefault(record.get(key), []).append(record)
    return [{key: value, **step_summary(records)} for value, records in groups.items()]
