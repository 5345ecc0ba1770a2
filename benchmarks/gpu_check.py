"""One command that measures the GPU path (`make gpu-check`), for a lent GPU machine with torch, transformers,
accelerate and peft but no TRL, no datasets, no vLLM and no network (carry TRL and datasets: `make gpu-wheels`);
tested on the CPU with the same code (`--device cpu --tiny`).

    python benchmarks/gpu_check.py --out gpu-check                    # on a GPU: three model shapes, bf16
    python benchmarks/gpu_check.py --device cpu --tiny --out /tmp/g   # the CPU test's run

Sections (`--sections`), each row guarded: a row that fails records its error, one that cannot run here (a package
not installed) says so, one that outruns its time limit or finds the budget spent says "skipped: ..."; the check
goes on, and writes `gpu-check.json` (everything) and `gpu-check.md` (the tables) into `--out` after every row.

- `env`: the date, the card, the versions of torch / transformers / accelerate / peft / trl / datasets / vllm, CUDA,
  the textenv commit;
- `cuda-tests`: the test modules marked `cuda` (`pytest -m cuda`), passed / failed / skipped;
- `generation`: the Gym benchmark's chat episodes (32 x 6 turns, 32 new tokens a turn, greedy) on random-weight
  models of each shape (`gpu_sections.py`), played by the per-turn `generate` loop and by GymScheduler on each
  engine (textenv, transformers' continuous batching, vLLM): seconds, speed-up over the loop, replies equal to its;
- `training`: PPO and GRPO steps, full and LoRA, beside TRL's `GRPOTrainer` on the same GRPO batch
  (`gpu_training.py`): median seconds per step and peak memory.

Time: `--budget-s` (default 450 s) for the whole check. A row runs under a time limit (its share of what is left,
at least 30 s; SIGALRM), none starts once the budget is spent, and a watchdog writes what was measured and ends the
process 15 s after the budget if a row cannot be interrupted. The Markdown ends with the issue's two goals,
checked (PASS / FAIL / not measured), and is printed at the end.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

from gpu_report import goals, markdown  # noqa: E402
from gpu_sections import SHAPES, Unavailable, build_shape, generation_paths, release_memory  # noqa: E402
from gpu_training import ROWS, training_rows  # noqa: E402

SECTIONS = ("env", "cuda-tests", "generation", "training")
PACKAGES = ("torch", "transformers", "accelerate", "peft", "trl", "datasets", "vllm", "pytest")
MIN_ROW_S, ROW_SHARE, WATCHDOG_GRACE_S, CUDA_TESTS_S = 30.0, 3.0, 15.0, 240.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"],
                        help="where the models run (default: cuda where torch sees one, else cpu)")
    parser.add_argument("--tiny", action="store_true", help="2-layer models, 4 episodes x 2 turns, 8 new tokens, small batches (the CPU test)")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), help=f"model shapes, from {', '.join(SHAPES)} (default: all)")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), help=f"sections, from {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--out", default="gpu-check", help="the folder for gpu-check.json and gpu-check.md (default: %(default)s)")
    parser.add_argument("--budget-s", type=float, default=450.0, help="seconds for the whole check (default: %(default)s)")
    args = parser.parse_args(argv)
    for flag, values, known in (("--shapes", args.shapes, SHAPES), ("--sections", args.sections, SECTIONS)):
        unknown = [value for value in values if value not in known]
        if unknown:
            parser.error(f"{flag}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; run on a GPU machine, or pass --device cpu --tiny")
    if args.budget_s <= 0:
        parser.error(f"--budget-s: must be a positive number of seconds, got {args.budget_s:g}")
    return args


class RowTimeout(BaseException):
    """A row ran past its time limit (raised in the main thread by SIGALRM; a BaseException, so that no `except
    Exception` on the way swallows it)."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise `RowTimeout` in the main thread after `seconds` (no limit off the main thread or without SIGALRM)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum, frame):
        raise RowTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Check:
    """The results so far, the budget and the output folder: every row is recorded and written at once, so a run
    that is cut short leaves what it measured."""

    def __init__(self, args: argparse.Namespace, settings: dict, planned_rows: int):
        self.out, self.budget_s, self.rows_left = Path(args.out), args.budget_s, planned_rows
        self.started = time.perf_counter()
        self.lock = threading.RLock()
        self.current = "starting"
        self.data: dict[str, Any] = {"settings": settings}
        self.out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.started)

    def set(self, key: str, value: Any) -> None:
        with self.lock:
            self.data[key] = value
            self.write()

    def run_row(self, where: tuple[str, ...], label: str, work: Callable[[], dict], limit: float | None = None, **fields) -> dict:
        """Run one row (`work()`, its figures) under its time limit, by default its share of what is left of the
        budget, and append it to the list at `data[where[0]][where[1]]...`."""
        share = max(MIN_ROW_S, ROW_SHARE * self.left() / max(self.rows_left, 1))
        limit, self.rows_left = min(self.left(), share if limit is None else limit), self.rows_left - 1
        row: dict[str, Any] = {"name": label, **fields}
        if self.left() < 1.0:
            row["skipped"] = f"skipped: the time budget ({self.budget_s:g} s) was spent"
        else:
            self.current, started = " / ".join((*where, label)), time.perf_counter()
            row.update(self._attempt(work, limit))
            row["wall_seconds"] = time.perf_counter() - started
            release_memory()
        with self.lock:
            node = self.data
            for key in where[:-1]:
                node = node.setdefault(key, {})
            node.setdefault(where[-1], []).append(row)
            self.write()
        return row

    @staticmethod
    def _attempt(work: Callable[[], dict], limit: float) -> dict:
        try:
            with time_limit(limit):
                return work()
        except RowTimeout:
            return {"skipped": f"skipped: ran past its time limit ({limit:.0f} s, its share of the budget)"}
        except Unavailable as error:
            return {"unavailable": str(error)}
        except Exception as error:  # noqa: BLE001 - recorded, the check goes on
            return {"error": one_line(error)}

    def finish(self, cut_short: str | None = None) -> str:
        """Add the totals and the goals, write both files, return the Markdown."""
        with self.lock:
            self.data["seconds"] = time.perf_counter() - self.started
            if cut_short:
                self.data["cut_short"] = cut_short
            self.data["goals"] = goals(self.data)
            return self.write()

    def write(self) -> str:
        with self.lock:
            text = markdown(self.data)
            (self.out / "gpu-check.json").write_text(json.dumps(self.data, indent=2, default=str))
            (self.out / "gpu-check.md").write_text(text)
            return text

    def start_watchdog(self) -> None:
        """End the process `WATCHDOG_GRACE_S` after the budget, with what was measured written and printed, if a
        row could not be interrupted (a hang in native code)."""

        def stop() -> None:
            with self.lock:
                text = self.finish(cut_short=f"the budget ({self.budget_s:g} s) ran out during {self.current}, which could not be interrupted")
                sys.stdout.write(text)
                sys.stdout.flush()
                os._exit(0)

        timer = threading.Timer(self.budget_s + WATCHDOG_GRACE_S, stop)
        timer.daemon = True
        timer.start()


def one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return text.splitlines()[0][:400]


# ------------------------------------------------------------------------------------------------ env, CUDA tests
def environment() -> dict:
    """The date, the card, the versions (or "not installed"), CUDA and the textenv commit."""
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    card = "no GPU (CPU)"
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        card = f"{torch.cuda.get_device_name()} ({properties.total_memory / 2**30:.0f} GiB)"
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "card": card,
            "cuda": torch.version.cuda or "none", "python": platform.python_version(), **versions, "textenv commit": commit()}


def commit() -> str:
    """`git describe`-like: the short commit and how many files the working tree changes, or why there is none."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = len(git("status", "--porcelain", "--untracked-files=no").splitlines())
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git here)"
    if not head:
        return "unknown (not a git checkout)"
    return head + (f" (+{changed} changed files)" if changed else "")


def cuda_tests() -> dict:
    """The test modules marked `cuda`, run by pytest in a subprocess (skipped without CUDA): the counts. The row's
    time limit (SIGALRM) interrupts the wait, and `subprocess.run` then kills pytest."""
    if importlib.util.find_spec("pytest") is None:
        raise Unavailable("not installed (pytest): carry the wheels: make gpu-wheels")
    modules = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").glob("test_*.py") if "pytest.mark.cuda" in path.read_text())
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", *modules]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines() or ["no output"]
    counts = {word: int(number) for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", lines[-1])}
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    counts["errors"] = counts.pop("error", 0) + counts.pop("errors", 0)
    return {"modules": modules, "summary": lines[-1], "exit_code": done.returncode,
            "counts": {key: counts.get(key, 0) for key in ("passed", "failed", "skipped", "errors")}, "failures": failures[:10]}


# ------------------------------------------------------------------------------------------------ the check
def run(args: argparse.Namespace) -> Check:
    """Every section asked for, row by row, under the budget; returns the check (its results written)."""
    import run_workloads

    gym = (4, 2, 8) if args.tiny else (run_workloads.GYM_EPISODES, run_workloads.GYM_TURNS, run_workloads.MAX_NEW_TOKENS)
    dtype, steps = (torch.bfloat16 if args.device == "cuda" else torch.float32), 2 if args.tiny else 3
    settings = {"device": args.device, "dtype": str(dtype).removeprefix("torch."), "tiny": args.tiny, "episodes": gym[0], "turns": gym[1],
                "max_new_tokens": gym[2], "timed_steps": steps, "shapes": args.shapes, "sections": args.sections, "budget_s": args.budget_s}
    per_shape = 1 + 4 * ("generation" in args.sections) + len(ROWS) * ("training" in args.sections)
    running = [section for section in ("generation", "training") if section in args.sections]
    check = Check(args, settings, planned_rows=("cuda-tests" in args.sections) + len(args.shapes) * per_shape * bool(running))
    check.start_watchdog()
    if "env" in args.sections:
        try:
            check.set("env", environment())
        except Exception as error:  # noqa: BLE001 - recorded, the check goes on
            check.set("env", {"error": one_line(error)})
    if "cuda-tests" in args.sections:
        check.run_row(("cuda_tests",), "pytest -m cuda", cuda_tests, limit=CUDA_TESTS_S)
    for name in args.shapes if running else ():
        built: dict[str, Any] = {}

        def build() -> dict:
            started = time.perf_counter()
            built["shape"] = build_shape(name, args.device, dtype, args.tiny)
            return {"parameters": built["shape"].parameters, "build_seconds": time.perf_counter() - started}

        check.run_row(("shapes",), name, build)
        shape = built.pop("shape", None)
        if shape is None:
            check.rows_left -= per_shape - 1
            continue

        def rows_of(section: str) -> Callable[..., dict]:
            return lambda label, work, **fields: check.run_row((section, name), label, work, **fields)

        if "generation" in args.sections:
            generation_paths(shape, *gym, rows_of("generation"))
        if "training" in args.sections:
            training_rows(shape, args.device, args.tiny, steps, rows_of("training"))
        del shape
        release_memory()
    return check


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    check = run(args)
    text = check.finish()
    print(text)
    return check.data


if __name__ == "__main__":
    main()
