"""Smoke tests of `examples/calculator.py`: `--help`, and a tiny run on the random tiny model."""

import importlib.util
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "calculator.py"


def load_example():
    spec = importlib.util.spec_from_file_location("calculator_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def logged_scalar_steps(log_dir: Path, tag: str) -> list[int]:
    """The steps at which `tag` was logged in any tensorboard event file under `log_dir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = []
    for folder in sorted({path.parent for path in log_dir.rglob("events.out.tfevents.*")}):
        accumulator = EventAccumulator(str(folder))
        accumulator.Reload()
        if tag in accumulator.Tags()["scalars"]:
            steps += [event.step for event in accumulator.Scalars(tag)]
    return steps


def test_help_lists_the_gpu_size_flags():
    result = subprocess.run([sys.executable, str(EXAMPLE), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for flag in ("--ppo_steps", "--batch-size", "--mini-batch-size", "--learning_rate", "--lora", "--no-lora", "--device", "--log-dir"):
        assert flag in result.stdout


def test_flags_reach_the_settings():
    example = load_example()
    settings, _, _ = example.parse(
        ["--ppo_steps", "7", "--batch-size", "32", "--mini-batch-size", "8", "--lr", "0.01", "--no-lora", "--device", "cuda"]
    )
    assert (settings.ppo_steps, settings.batch_size, settings.mini_batch_size) == (7, 32, 8)
    assert settings.learning_rate == 0.01 and settings.lora is False and settings.device == "cuda"


def test_tiny_run_logs_to_tensorboard_saves_and_summarises(tmp_path, capsys):
    example = load_example()
    log_dir, save_dir = tmp_path / "runs", tmp_path / "model"
    summary = example.main(
        [
            "--model", "tiny", "--ppo_steps", "2", "--batch-size", "2", "--mini-batch-size", "1", "--ppo-epochs", "1",
            "--max-new-tokens", "6", "--max-turns", "1", "--eval-tasks", "2",
            "--log-dir", str(log_dir), "--save-dir", str(save_dir), "--no-progress",
        ]
    )
    out = capsys.readouterr().out

    assert summary["steps"] == 2 and summary["episodes"] == 4
    assert 0.0 <= summary["held_out_sampled_accuracy"] <= 1.0
    assert "calculator PPO summary" in out and "held-out accuracy (sampled, 2 tasks)" in out
    assert logged_scalar_steps(log_dir, "env/reward_mean") == [1, 2]  # current_step counts finished PPO steps, as in legacy TRL
    assert logged_scalar_steps(log_dir, "objective/kl") == [1, 2]  # current_step counts finished PPO steps, as in legacy TRL
    assert (save_dir / "adapter_model.safetensors").is_file()
    assert (save_dir / "pytorch_model.bin").is_file()  # the value head, in legacy TRL's PEFT layout
