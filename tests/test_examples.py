"""The example scripts: `--help` for every script in examples/ and a tiny end-to-end run of the trivia and
Python-interpreter examples (rollout -> PPO step -> tensorboard -> summary). Their tasks (prompts, shipped
data, rewards) are tested in test_example_triviaqa.py and test_example_word_problems.py."""

import re
import runpy
import sys
from pathlib import Path

import pytest


EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = sorted(path for path in EXAMPLES_DIR.glob("*.py") if 'if __name__ == "__main__":' in path.read_text())
TINY_RUN = ["--model", "tiny", "--ppo_steps", "1", "--batch-size", "2", "--mini-batch-size", "2", "--max-new-tokens", "8", "--eval-tasks", "1",
            "--threads", "0", "--no-progress"]


def run_script(path: Path, argv: list[str], monkeypatch) -> None:
    """Run `path` as `python path *argv` would, in this process (the imports are shared, which keeps the
    test fast)."""
    monkeypatch.setattr(sys, "argv", [str(path), *argv])
    monkeypatch.syspath_prepend(str(path.parent))
    runpy.run_path(str(path), run_name="__main__")


def example_main(name: str):
    return runpy.run_path(str(EXAMPLES_DIR / f"{name}.py"))["main"]


# ------------------------------------------------------------------------------------------------ --help
def test_the_scripts_are_found():
    assert {"triviaqa.py", "python_interpreter.py"} <= {path.name for path in SCRIPTS}


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: path.name)
def test_help(path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_script(path, ["--help"], monkeypatch)
    assert exit_info.value.code in (0, None)
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["triviaqa", "python_interpreter"])
def test_help_lists_the_run_options(name, monkeypatch, capsys):
    with pytest.raises(SystemExit):
        run_script(EXAMPLES_DIR / f"{name}.py", ["--help"], monkeypatch)
    usage = capsys.readouterr().out
    for option in ["--model", "--ppo_steps", "--batch-size", "--lora", "--no-lora", "--device", "--log-dir", "--max-new-tokens"]:
        assert option in usage


# ------------------------------------------------------------------------------------------------ tiny runs
def tensorboard_scalars(log_dir: Path) -> dict[str, list]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = {}
    for event_file in log_dir.glob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(event_file))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars[tag] = accumulator.Scalars(tag)
    return scalars


@pytest.mark.parametrize("name", ["triviaqa", "python_interpreter"])
def test_tiny_run_trains_logs_and_summarises(name, tmp_path, capsys):
    run_dir = ["--output_dir", str(tmp_path / "run")]  # not outputs/ of the checkout
    summary = example_main(name)([*TINY_RUN, *run_dir, "--log-dir", str(tmp_path / "runs"), "--save-dir", str(tmp_path / "model")])

    printed = capsys.readouterr().out
    assert f"=== {name} PPO summary ===" in printed
    assert re.search(r"mean reward: first 1 step\(s\) \d\.\d{3}, last 1 step\(s\) \d\.\d{3}; final KL", printed)
    assert re.search(r"held-out accuracy \(greedy, 1 ", printed)
    assert re.search(r"wall time: \d+\.\d s", printed)
    assert summary["steps"] == 1 and 0.0 <= summary["first_reward"] <= 1.0 and summary["seconds"] > 0

    scalars = tensorboard_scalars(tmp_path / "runs" / name)
    assert len(scalars["env/reward_mean"]) == 1  # one PPO step, one logged point
    assert scalars["env/reward_mean"][0].value == pytest.approx(summary["last_reward"])
    assert "objective/kl" in scalars and "ppo/loss/total" in scalars

    assert (tmp_path / "model" / "adapter_config.json").is_file()  # LoRA is on by default
    assert (tmp_path / "model" / "pytorch_model.bin").is_file()  # the value head, in legacy TRL's PEFT layout


def test_ppo_step_example_trains_through_the_one_loop(tmp_path, monkeypatch):
    """`examples/ppo_step.py` plays bundled-model episodes and steps PPO through `textenv.training.train`,
    printing each step's statistics from `on_step`."""
    from textenv import training

    steps_seen = []
    real_train = training.train

    def recording_train(trainer, episodes, steps, **kwargs):
        logs = real_train(trainer, episodes, steps, **kwargs)
        steps_seen.extend(log.step for log in logs)
        return logs

    monkeypatch.setattr(training, "train", recording_train)
    main = example_main("ppo_step")
    stats = main(["--ppo_steps", "2", "--batch-size", "2", "--mini-batch-size", "1", "--max-new-tokens", "4", "--max-turns", "1"])
    assert steps_seen == [0, 1] and len(stats) == 2
    assert all(0.0 <= step["env/reward_mean"] <= 1.0 and "ppo/loss/total" in step for step in stats)
