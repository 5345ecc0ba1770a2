"""The light install: the core imports no optional package, and a missing one names its extra."""

from __future__ import annotations

import subprocess
import sys

import pytest

from textenv.extras import EXTRAS, MissingExtraError, require

OPTIONAL = ("matplotlib", "gguf", "bm25s", "Stemmer", "tensorboard", "wandb", "trackio", "deepspeed", "smolagents")


def test_importing_the_core_pulls_no_optional_package():
    code = (
        "import sys, textenv, textenv.environment, textenv.gym, textenv.ppo, textenv.training, textenv.tools, textenv.chat\n"
        "from textenv import TextEnvironment, PPOTrainer, PPOConfig, GymScheduler\n"
        f"print(sorted(name for name in {OPTIONAL!r} if name in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_a_missing_optional_package_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes the import fail, even after an earlier import
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(MissingExtraError, match=r"the demo's reward curve needs the `matplotlib` package.*pip install 'textenv\[demo\]'"):
        require("matplotlib.pyplot", "the demo's reward curve")


def test_an_unknown_package_gets_a_plain_pip_command():
    with pytest.raises(MissingExtraError, match="pip install no_such_package_xyz$"):
        require("no_such_package_xyz", "a test")


def test_every_optional_package_has_an_extra():
    assert set(OPTIONAL) == set(EXTRAS)


def test_a_tracker_without_its_package_names_the_extra(monkeypatch):
    from textenv import PPOConfig

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(MissingExtraError, match=r"log_with='wandb' needs the `wandb` package.*textenv\[trackers\]"):
        PPOConfig(log_with="wandb")
