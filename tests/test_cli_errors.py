"""A settings error of any command is one line naming the options and the fix, exit status 2, no traceback;
``--debug`` (or ``TEXTENV_DEBUG=1``) raises it with its traceback; an error after the settings are in place is
not swallowed. Also: the help names every task and algorithm, and `textenv serve --host` says why going beyond
the loopback needs care."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from textenv.cli import SUBCOMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name_or_path", "tiny", "--ppo_steps", "1", "--batch_size", "2", "--max_new_tokens", "3", "--no_progress"]
GYM = ["--dataset", "examples/data/guess_number.jsonl", "--external_plugins", "examples/gym_plugin.py", "--gym_env", "guess_number"]

SETTINGS_ERRORS = {
    "train: unknown option": (["train", "--lerning_rate", "1e-5"], "unknown option --lerning_rate (did you mean --learning_rate?)"),
    "train: an abbreviation": (["train", "--learning", "1e-5"], "unknown option --learning (did you mean --learning_rate?)"),
    "train: bad value": (["train", "--batch_size", "sixteen"], "invalid int value: 'sixteen'"),
    "train: unknown task": (["train", "--task", "chess"], "--task must be one of calculator, gym, verifiers"),
    "train: groups that do not fill the batch": (["train", "--algorithm", "grpo", "--batch_size", "12"], "multiple of --num_generations (8)"),
    "train: two run lengths": (["train", "--steps", "32", "--ppo_steps", "2"], "give one"),
    "train: missing config file": (["train", "--config", "missing.yaml"], "--config missing.yaml: no such file"),
    "train: missing dataset": (["train", "--task", "gym", "--dataset", "missing.jsonl", "--gym_env", "tool_env", *TINY], "no such file or folder"),
    "train: unregistered env": (["train", "--task", "gym", "--dataset", "examples/data/guess_number.jsonl", "--gym_env", "guess", *TINY],
                                "--gym_env guess: Environment 'guess' not found"),
    "train: missing environment class file": (["train", "--task", "gym", "--dataset", "examples/data/counter.jsonl",
                                               "--environment_factory", "missing.py:Env", *TINY], "missing.py"),
    "train: bad JSON": (["train", "--task", "verifiers", "--env_id", "arithmetic", "--env_args", "{"], "--env_args '{' is not JSON"),
    "train: a model that is not there": (["train", *TINY, "--model_name_or_path", "./no-such-model-folder"], "model folder ./no-such-model-folder does not exist"),
    "train: no checkpoint to resume": (["train", *TINY, "--resume_from_checkpoint", "latest", "--output_dir", "{tmp}"], "no complete checkpoint"),
    "rollout: no rows": (["rollout", "--model", "tiny"], "no rows to play: give --dataset"),
    "rollout: a verifiers option without its task": (["rollout", "--env_id", "arithmetic"], "--task verifiers needs --env_id"),
    "rollout: unknown engine": (["rollout", "--model", "tiny", *GYM, "--engine", "tgi"],
                                "--engine must be one of ['textenv', 'transformers', 'vllm', 'auto'], got 'tgi'"),
    "rollout: unregistered context manager": (["rollout", "--model", "tiny", *GYM, "--context_manager", "nope"], "--context_manager nope"),
    "demo: bad tool format": (["demo", "--tool_format", "xml"], "--tool_format must be one of"),
    "demo: groups that do not fill the batch": (["demo", "--algorithm", "grpo", "--batch_size", "12"], "multiple of --num_generations (8)"),
    "view: no path": (["view"], "PATH is missing"),
    "view: a path that is not there": (["view", "missing-run"], "'missing-run' does not exist"),
    "serve: bad port": (["serve", "--port", "0"], "--port must be from 1 to 65535"),
    "serve: bad KV cache": (["serve", "--kv_cache_gib", "0"], "--kv_cache_gib must be"),
    "check-model: no model": (["check-model"], "MODEL is missing"),
    "check-model: a model path that is not there": (["check-model", "./no-such-model"], "no-such-model"),
    "check-model: a template file that is not there": (["check-model", "bundled", "--chat_template", "missing.jinja"], "--chat_template missing.jinja: no such file"),
    "check-model: an unknown parser": (["check-model", "bundled", "--tool_parser", "xml"], "tool_parser='xml' (--tool_parser) is not a known tool-call parser"),
    "check-model: tools that are not tools": (["check-model", "bundled", "--tools", "textenv.options:DEFAULT_BATCH_SIZE"], "int has no tools"),
    "no such command": (["trian", "--task", "calculator"], "no command 'trian'; choose one of demo, train, rollout, serve, check-model, view"),
}


@pytest.mark.parametrize("name", SETTINGS_ERRORS)
def test_a_settings_error_is_one_line_and_exit_status_2(name, capsys, monkeypatch, tmp_path):
    argv, message = SETTINGS_ERRORS[name]
    monkeypatch.chdir(ROOT)
    assert main([argument.replace("{tmp}", str(tmp_path)) for argument in argv]) == 2
    error = capsys.readouterr().err
    where = "textenv" if name == "no such command" else f"textenv {argv[0]}"
    assert error.startswith(f"{where}: error: ") and error.count("\n") == 1, error
    assert message in error and "Traceback" not in error


def test_every_command_has_settings_errors_tested():
    assert {argv[0] for argv, _ in SETTINGS_ERRORS.values()} >= set(SUBCOMMANDS)


def test_debug_raises_the_error_with_its_traceback(monkeypatch):
    with pytest.raises(ValueError, match="--task must be one of"):
        main(["train", "--task", "chess", "--debug"])
    monkeypatch.setenv("TEXTENV_DEBUG", "1")
    with pytest.raises(ValueError, match="multiple of --num_generations"):
        main(["train", "--algorithm", "grpo", "--batch_size", "12"])


def test_an_error_after_the_settings_is_not_said_in_one_line(monkeypatch):
    import textenv.training.loop

    def failing_train(*args, **kwargs):
        raise ValueError("a bug in a step")

    monkeypatch.setattr(textenv.training.loop, "train", failing_train)
    with pytest.raises(ValueError, match="a bug in a step"):
        main(["train", *TINY])


def test_the_console_script_exits_2_with_one_line():
    console = Path(sys.executable).with_name("textenv")
    completed = subprocess.run([str(console), "train", "--lerning_rate", "1e-5"], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 2 and completed.stdout == ""
    assert completed.stderr == ("textenv train: error: unknown option --lerning_rate (did you mean --learning_rate?); "
                                "see textenv train --help.\n")


def test_the_help_names_every_command_task_and_algorithm(capsys):
    from textenv.grpo.config import ALGORITHMS
    from textenv.gym.command import TASKS as ROLLOUT_TASKS
    from textenv.training.command import TASKS as TRAIN_TASKS

    top = build_parser().format_help()
    assert all(name in top for name in SUBCOMMANDS)
    for task in TRAIN_TASKS:
        assert f"textenv train --task {task}" in top
    for task in ROLLOUT_TASKS:
        assert f"textenv rollout --task {task}" in top
    assert all(f"--algorithm ppo|grpo" in synopsis for synopsis in SUBCOMMANDS["train"].synopses)
    for command, tasks in (("train", TRAIN_TASKS), ("rollout", ROLLOUT_TASKS)):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert all(task in text for task in tasks) and (command == "rollout" or all(algorithm in text for algorithm in ALGORITHMS))


def test_serve_warns_why_a_host_beyond_the_loopback_needs_care(monkeypatch, caplog):
    import textenv.vllm.server as server

    assert all(server.host_warning(host) is None for host in ("127.0.0.1", "localhost", "::1"))
    warning = server.host_warning("0.0.0.0")
    assert "VLLM_SERVER_DEV_MODE=1" in warning and "ssh -L" in warning
    args, extra = server.parse(["--model", "bundled", "--host", "0.0.0.0", "--enforce-eager"])
    assert args.host == "0.0.0.0" and extra == ["--enforce-eager"]

    started = []

    class NotStarting:
        def __init__(self, model, port, dtype, python, extra, **kwargs):
            started.append(kwargs["host"])
            self.log_path = "log"

        def start(self):
            raise RuntimeError("not started in this test")

        def stop(self):
            pass

    monkeypatch.setattr(server, "VLLMServer", NotStarting)
    monkeypatch.setattr(server, "resolve_model_folder", lambda model: model)
    with caplog.at_level(logging.WARNING, logger="textenv"), pytest.raises(SystemExit):
        main(["serve", "--model", "some-folder", "--host", "0.0.0.0", "--dtype", "float32"])
    assert started == ["0.0.0.0"] and "--host 0.0.0.0: the server will listen beyond this machine" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="textenv"), pytest.raises(SystemExit):
        main(["serve", "--model", "some-folder", "--dtype", "float32"])
    assert started[-1] == "127.0.0.1" and "beyond this machine" not in caplog.text


def test_a_server_on_all_interfaces_is_reached_on_the_loopback(tmp_path):
    from textenv.vllm.server import VLLMServer

    everywhere = VLLMServer(str(tmp_path), 8123, "float32", vllm_python=sys.executable, host="0.0.0.0")
    assert everywhere.command[everywhere.command.index("--host") + 1] == "0.0.0.0" and everywhere.url == "http://127.0.0.1:8123"
    local = VLLMServer(str(tmp_path), 8123, "float32", vllm_python=sys.executable)
    assert local.command[local.command.index("--host") + 1] == "127.0.0.1"
