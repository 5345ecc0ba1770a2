"""Every documented command runs as written.

Each command line of the README, the pages, the notebooks, the examples' docstrings and every command's ``--help``
(tests/docs_commands.py finds them, prefixed ones and inline ones too) is parsed by that command's own ``parse``
with its values, from the repository's folder, as a reader types it there; a parse builds and checks the
command's settings together (no model is loaded). Mutations of documented lines (a misspelt option, values that do
not go together, ...) must fail that same check, and a page written with such a line must fail it through the
same scan. A subset, one line per command and task, runs end to end as a subprocess of the console script, for
one training step on the bundled model (`textenv serve`'s line runs on a real vLLM in
tests/test_server_lifecycle.py::test_real_vllm_stops_on_sigterm_while_serving, in the vLLM part).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_commands import DocumentedCommand, all_commands, page_commands, parse_function
from tests.docs_blocks import ROOT

COMMANDS = all_commands()
LINES = [command for command in COMMANDS if not command.only_named]
NAMED = [command for command in COMMANDS if command.only_named]
ONE_STEP = ["--ppo_steps", "1", "--no_progress"]
RUN_TIMEOUT_S = 900


def check(command: DocumentedCommand) -> None:
    """Parse `command` with its program's own parser, from the repository's folder; raises what the parse raises."""
    assert "..." not in command.argv, f"{command}: write the whole command (no '...')"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        parse_function(command.program)(command.argv)
    finally:
        os.chdir(cwd)


def test_commands_are_found_in_every_kind_of_place():
    places = {command.where.split(":")[0].split(" (")[0] for command in COMMANDS}
    expected = {"README.md", "docs/getting-started.md", "docs/guides/cli.md", "docs/guides/grpo.md", "docs/guides/gym.md",
                "docs/guides/trl-environments.md", "docs/guides/verifiers.md", "docs/guides/environments.md", "examples/gym_env.py", "textenv --help",
                *(f"textenv {name} --help" for name in ("train", "rollout", "serve", "view")), "examples/calculator.py --help"}
    assert expected <= places, f"no command found in {sorted(expected - places)}"
    assert any(command.environment for command in LINES) and any("/" in command.text.split("textenv")[0] for command in LINES)


@pytest.mark.parametrize("command", LINES, ids=lambda command: f"{command.where}:{command.program}")
def test_a_documented_command_parses_with_its_values(command):
    check(command)


def test_only_the_synopses_of_textenv_help_use_placeholders():
    import shlex

    from tests.docs_commands import PLACEHOLDERS

    def placeholders(text: str) -> set[str]:
        return {part for token in shlex.split(text, comments=True) for part in token.strip("[]").split("|") if part in PLACEHOLDERS}

    elsewhere = sorted({str(command) for command in LINES if placeholders(command.text) and command.where.split(" (")[0] != "textenv --help"})
    assert not elsewhere, f"a documented command a reader types has placeholders (write real values): {elsewhere}"


@pytest.mark.parametrize("command", NAMED, ids=lambda command: f"{command.where}:{command.program}")
def test_a_named_command_exists(command):
    from textenv.cli import SUBCOMMANDS

    assert command.program in SUBCOMMANDS or (ROOT / command.program).is_file(), f"{command}: no such command"


def documented(where: str, start: str) -> DocumentedCommand:
    """The documented line at `where` (a page or help) whose text starts with `start`."""
    found = [command for command in LINES if command.where.startswith(where) and command.text.startswith(start)]
    assert found, f"no documented line in {where} starts with {start!r}"
    return found[0]


def replaced(argv: list[str], option: str, value: str | None = None, rename: str | None = None) -> list[str]:
    """`argv` with `option`'s value set to `value` (appended if absent) or the option renamed to `rename`."""
    argv = list(argv)
    if rename is not None:
        return [rename if argument == option else argument for argument in argv]
    if option in argv:
        argv[argv.index(option) + 1] = value
        return argv
    return [*argv, option, value]


GRPO_LINE = ("docs/guides/grpo.md", "textenv train --task calculator --algorithm grpo")
MUTATIONS = {
    "misspelt option": (GRPO_LINE, lambda argv: replaced(argv, "--learning_rate", rename="--learning_rat"), "unknown option --learning_rat"),
    "groups that do not fill the batch": (GRPO_LINE, lambda argv: replaced(argv, "--num_generations", "6"), "must be a multiple of --num_generations"),
    "mini-batches that do not fill the batch": (GRPO_LINE, lambda argv: replaced(argv, "--mini_batch_size", "5"), "must be a multiple of"),
    "two run lengths": (GRPO_LINE, lambda argv: [*argv, "--steps", "32", "--ppo_steps", "2"], "give one"),
    "a value of the wrong type": (GRPO_LINE, lambda argv: replaced(argv, "--batch_size", "sixteen"), "invalid int value"),
    "an unknown task": (("docs/guides/gym.md", "textenv rollout"), lambda argv: [*argv, "--task", "chess"], "--task must be one of"),
    "a verifiers option without verifiers": (("docs/guides/gym.md", "textenv rollout"), lambda argv: [*argv, "--env_id", "arithmetic"],
                                             "--env_id"),
    "bad JSON": (("docs/guides/verifiers.md", "PYTHONPATH=examples/verifiers textenv rollout"),
                 lambda argv: replaced(argv, "--env_args", '{"num_eval_examples": 8'), "is not JSON"),
    "no path to view": (("docs/guides/watching.md", "textenv view"), lambda argv: argv[1:], "PATH is missing"),
    "a port that does not exist": (("docs/guides/vllm.md", "textenv serve"), lambda argv: replaced(argv, "--port", "70000"), "--port must be"),
    "an example's misspelt option": (("examples/calculator.py", "python examples/calculator.py"),
                                     lambda argv: replaced(argv, "--ppo_steps", rename="--steps"), "unknown option --steps"),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_a_mutated_documented_command_fails_the_check(name):
    (where, start), mutate, message = MUTATIONS[name]
    command = documented(where, start)
    check(command)  # as documented, it passes
    mutated = DocumentedCommand(command.where, command.text, command.program, mutate(command.argv), command.environment)
    with pytest.raises(ValueError, match=message):
        check(mutated)


def test_a_page_with_a_wrong_command_fails_through_the_same_scan(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Run it:\n\n```bash\ntextenv train --task calculator --lerning_rate 2e-4\n```\n\n"
                    "or `CUDA_VISIBLE_DEVICES=0 .venv/bin/textenv train --algorithm grpo --batch_size 12`, then `textenv view ...`.\n")
    commands = page_commands(page)
    assert [(command.where.split(":")[-1], command.argv) for command in commands] == [
        ("4", ["--task", "calculator", "--lerning_rate", "2e-4"]), ("7", ["--algorithm", "grpo", "--batch_size", "12"]), ("7", ["..."])]
    assert commands[1].environment == {"CUDA_VISIBLE_DEVICES": "0"}
    for command, message in zip(commands, ["unknown option --lerning_rate", "multiple of --num_generations", "write the whole command"]):
        with pytest.raises((ValueError, AssertionError), match=message):
            check(command)


def test_the_trl_guides_class_is_the_example_files():
    def class_source(source: str) -> str:
        tree = ast.parse(source)
        (node,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "CounterEnv"]
        return ast.get_source_segment(source, node)

    page = (ROOT / "docs/guides/trl-environments.md").read_text()
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert class_source(block) == class_source((ROOT / "examples/counter_env.py").read_text())


# ------------------------------------------------------------------------------------------ end to end

def run_as_typed(command: DocumentedCommand, workdir: Path, extra: list[str]) -> subprocess.CompletedProcess:
    """`command` through the console script of this environment, in `workdir` (where `examples` and `tests` lead to
    the repository's), with its documented environment assignments and `extra` arguments."""
    for folder in ("examples", "tests"):
        if not (workdir / folder).exists():
            (workdir / folder).symlink_to(ROOT / folder)
    program = [str(Path(sys.executable).with_name("textenv")), command.program] if not command.is_example else [sys.executable, command.program]
    environment = {**os.environ, **command.environment}
    return subprocess.run([*program, *command.argv, *extra], cwd=workdir, env=environment, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)


def steps_written(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]


def assert_ran(completed: subprocess.CompletedProcess, command: DocumentedCommand) -> None:
    assert completed.returncode == 0, f"{command}\nexit {completed.returncode}:\n{completed.stderr[-4000:]}"
    assert "Traceback" not in completed.stderr


def test_the_training_guides_calculator_lines_train_one_step_and_the_view_shows_it(tmp_path):
    train = documented("docs/guides/watching.md", "textenv train --task calculator")
    assert_ran(run_as_typed(train, tmp_path, ONE_STEP), train)
    assert [step["episodes"] for step in steps_written(tmp_path / "outputs/calc")] == [8]
    view = documented("docs/guides/watching.md", "textenv view outputs/calc")
    assert_ran(run_as_typed(view, tmp_path, []), view)
    assert "textenv view: outputs/calc" in (tmp_path / "page.html").read_text()


@pytest.mark.parametrize("where, start, run_dir", [
    ("docs/guides/grpo.md", "textenv train --task calculator --algorithm grpo", "outputs/train"),
    ("docs/guides/gym.md", "textenv train --task gym", "outputs/guess_number"),
    ("docs/guides/trl-environments.md", "textenv train --task gym", "outputs/counter"),
    ("docs/guides/verifiers.md", "PYTHONPATH=examples/verifiers textenv train", "outputs/arithmetic"),
], ids=["calculator-grpo", "gym", "trl-environment-grpo", "verifiers-grpo"])
def test_a_documented_train_line_trains_one_step(tmp_path, where, start, run_dir):
    command = documented(where, start)
    assert_ran(run_as_typed(command, tmp_path, ONE_STEP), command)
    (step,) = steps_written(tmp_path / run_dir)
    assert step["episodes"] == 16  # the default batch, trained on
    assert any((tmp_path / run_dir / "final").iterdir())


@pytest.mark.parametrize("where, start, episodes", [
    ("docs/guides/gym.md", "textenv rollout", 32),
    ("docs/guides/verifiers.md", "PYTHONPATH=examples/verifiers textenv rollout", 8),
    ("docs/guides/environments.md", "PYTHONPATH=examples/openenv textenv rollout", 32),
], ids=["gym", "verifiers", "openenv"])
def test_a_documented_rollout_line_writes_its_episodes(tmp_path, where, start, episodes):
    command = documented(where, start)
    assert_ran(run_as_typed(command, tmp_path, ["--no_progress"]), command)
    lines = (tmp_path / "completions.jsonl").read_text().splitlines()
    assert len(lines) == episodes and all(json.loads(line)["error"] is None for line in lines)


def test_the_documented_demo_line_runs_quick(tmp_path):
    command = documented("docs/guides/grpo.md", "textenv demo --algorithm grpo")
    assert_ran(run_as_typed(command, tmp_path, ["--quick", "--no_progress"]), command)
    assert (tmp_path / "outputs/demo/reward_curve.png").is_file() and len(steps_written(tmp_path / "outputs/demo")) == 2


def test_the_command_line_page_lists_every_option_class_and_option():
    import dataclasses
    import re

    from trl import ModelConfig

    from textenv.cli import SUBCOMMANDS
    from textenv.ppo import PPOConfig
    from tests.docs_commands import help_text

    page = (ROOT / "docs/guides/cli.md").read_text()
    for name in ("PPOConfig", "ModelConfig", "EpisodeArguments", "GymArguments", "AlgorithmArguments", "RunArguments", "RolloutArguments",
                 "Settings", "DemoArguments", "ExampleArguments", "CommandArguments", "ViewArguments"):
        assert f"`{name}`" in page, f"docs/guides/cli.md does not name the option class {name}"
    named_by_class = {f"--{field.name}" for owner in (PPOConfig, ModelConfig) for field in dataclasses.fields(owner)}
    for command in SUBCOMMANDS:
        spelled = {"--" + option[2:].replace("-", "_") for option in re.findall(r"\[(--[a-z][a-z0-9_-]*)", help_text(command))}  # usage
        complements = {option for option in spelled if option.startswith("--no_") and "--" + option[5:] in spelled}  # HfArgumentParser's --no_X
        options = spelled - complements - named_by_class - {"--help", "--config"}
        missing = sorted(option for option in options if f"`{option}`" not in page)
        assert not missing, f"docs/guides/cli.md does not list textenv {command}'s {missing}"
