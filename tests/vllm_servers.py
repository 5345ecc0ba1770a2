"""vLLM servers for the tests of the vLLM backend: the bundled model in float32, started once per test
session from `.venv-vllm` (`make vllm`). Tests that need them skip, with the reason, where vLLM is not
installed or a server does not start. While working on the backend, `TEXTENV_VLLM_TEST_URLS=url1,url2`
points the tests at servers already running (started with `textenv serve --dtype float32`); tests that
stop a server then skip."""

from __future__ import annotations

import os
import threading

import pytest

from textenv.models import bundled_model_path
from textenv.vllm.server import VLLMServer, find_vllm_python, free_port, shared_server

_servers: list[VLLMServer] = []
_failure: str | None = None
_starts = 0  # how many times servers were started this session (the first start goes through `shared_server`)


def bundled_servers(count: int = 2) -> list[VLLMServer]:
    """`count` running servers of the bundled model, or a skip. Servers are shared by every module of the session
    (the modules that run vLLM run one after another in one process: `pytest --vllm-part`): a server a test
    stopped is replaced, more are started (together) when a module needs more than run, and all stop when the
    session ends (`stop_all`, from conftest)."""
    global _servers, _failure
    if os.environ.get("TEXTENV_VLLM_TEST_URLS"):
        return [RunningServer(url) for url in os.environ["TEXTENV_VLLM_TEST_URLS"].split(",")][:count]
    _servers = [server for server in _servers if server.process is not None and server.process.poll() is None]
    if len(_servers) < count and _failure is None:
        try:
            python = find_vllm_python()
        except FileNotFoundError as error:
            _failure = str(error)
        else:
            started, errors = _start(python, count - len(_servers), through_shared_server=_starts == 0)
            _servers += started
            if errors:
                _failure = f"a vLLM server did not start: {errors[0]}"
    if _failure is not None:
        pytest.skip(_failure)
    return _servers[:count]


def _start(python: str, count: int, through_shared_server: bool) -> tuple[list[VLLMServer], list[str]]:
    """Start `count` servers at once; with `through_shared_server`, the first as `--engine vllm` without a URL
    starts one (`shared_server`, so that path runs for real), the others directly."""
    global _starts
    _starts += 1
    folder = str(bundled_model_path())
    servers: list = [None] * count
    errors: list[str] = []

    def start(index: int) -> None:
        try:
            if index == 0 and through_shared_server:
                servers[0] = shared_server(folder, "float32")
            else:
                servers[index] = VLLMServer(folder, free_port(), "float32", vllm_python=python, kv_cache_gib=1).start(timeout=600)
        except RuntimeError as error:
            errors.append(str(error))

    threads = [threading.Thread(target=start, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [server for server in servers if server is not None], errors


GREEDY = {"max_new_tokens": 24, "do_sample": False}


def calculator_env(model, tokenizer, engine, tool_format="tags", generation_kwargs=GREEDY):
    """The calculator task's `TextEnvironment` (three turns) on `engine`, for the vLLM tests' greedy comparisons."""
    from textenv.environment import TextEnvironment
    from textenv.tasks import calculator as task
    from textenv.tools import Calculator

    if tool_format == "json":  # a JSON call of the calculator is about 34 tokens
        generation_kwargs = {**generation_kwargs, "max_new_tokens": 48}
    return TextEnvironment(
        model, tokenizer, {task.TOOL_NAME: Calculator()},
        task.json_exact_match_reward if tool_format == "json" else task.exact_match_reward,
        task.JSON_PROMPT if tool_format == "json" else task.PROMPT,
        max_turns=3, generation_kwargs=generation_kwargs, tool_format=tool_format, engine=engine,
    )


def lora_policy(base):
    """A LoRA copy of `base` whose adapters are random (lora_B ~ N(0, 0.05)), so that they change its tokens."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(copy.deepcopy(base), LoraConfig(r=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05)
    return policy


def stop_all() -> None:
    """Stop the servers (at the end of the session); a later `bundled_servers` call starts new ones."""
    global _servers
    for server in _servers:
        server.stop()
    _servers = []


class RunningServer:
    """A server started outside the tests (`TEXTENV_VLLM_TEST_URLS`): the tests never stop it."""

    def __init__(self, url: str):
        self.url = url

    def stop(self) -> None:
        pytest.skip("the test stops a server, and TEXTENV_VLLM_TEST_URLS servers are not the tests' to stop")
