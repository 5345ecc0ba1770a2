"""verifiers v1 tasksets in the Gym front end: ``GymScheduler(verifiers_env=load_v1_environment(ID))``.

verifiers 0.4 (the v1 API) plays an episode with its own code: `Env.run_episode` sets the task up, launches
the agent's harness program, which talks to the model over HTTP through verifiers' interception server, and
scores the trace with the task's `@vf.reward` / `@vf.metric` functions and judges. textenv is the model at
the end of that line: `EpisodeEndpoint` serves each episode its own OpenAI-compatible chat endpoint, and
every request it gets becomes a turn of textenv's episode driver, generated from the episode's exact token
ids (never the re-tokenised messages the harness sends back).

`V1Episode` is one episode as a Gym `Env`: `reset` starts `run_episode` and returns the messages of its first
model request (system prompt and prompt) with its tools; `step` answers the request with the model's reply
and returns what the harness sent next (tool results, or a user turn of the env's `run`), or ``done`` when the
episode ended; `final_reward` is the trace's reward, its rewards, metrics and errors go to the trajectory
info. Drivable: single-agent envs whose harness is verifiers' chat loop (``null``: plain chat with the task's
MCP tools) on the local ``subprocess`` runtime; other harnesses (coding agents, external programs), sandbox
runtimes and multi-agent envs are refused with what is missing.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import json
import os
import shutil
import sys
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Dict, Iterator, List, Mapping, Optional, Tuple

from verifiers.v1.clients import EvalClientConfig, ModelContext
from verifiers.v1.configs.agent import agent_config_fields
from verifiers.v1.env import Env as V1Env
from verifiers.v1.types import SamplingConfig
from verifiers.v1.utils.loaders import env_config_type, load_environment, resolve_env_config

from textenv.engine.stopping import FINISH_LENGTH
from textenv.environments.kind import SimpleKind
from textenv.gym.env import Env, Messages, RolloutInferRequest
from textenv.environments.verifiers_endpoint import ChatReply, ContextOverflow, EpisodeEndpoint
from textenv.environments.verifiers_messages import chat_dicts, tool_call_records

DRIVABLE_HARNESSES = ("null",)  # verifiers' chat loop: chat completions with the task's MCP tools
LOCAL_RUNTIMES = ("subprocess",)
DEFAULT_AGENT = {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}
CLOSE_GRACE_SECONDS = 30.0  # how long an episode cut short waits for verifiers to finish and score it


def load_v1_environment(env_id: str, env_args: Optional[Mapping[str, Any]] = None) -> V1Env:
    """A verifiers v1 env for taskset `env_id`, played by verifiers' chat harness on the local runtime.

    Args:
        env_id (`str`): the taskset id (its installed package or module, e.g. ``"glossary"``).
        env_args (`dict`, *optional*): the env config over that default, as verifiers' ``--env.*`` options
            nest it: ``{"taskset": {...}, "agent": {"max_turns": 4, ...}, "timeout": {...}}``.

    Raises:
        ModuleNotFoundError: no taskset of that id is installed (the message says how to install one).
    """
    env_args = dict(env_args or {})
    try:
        single_agent = "agent" in env_config_type(env_id, env_args.get("id") or "").model_fields  # else roles of its own
        defaults = {"taskset": {"id": env_id}, **({"agent": copy.deepcopy(DEFAULT_AGENT)} if single_agent else {})}
        return load_environment(resolve_env_config(_merged(defaults, env_args)))
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"--env_id {env_id!r}: {error} Install the taskset first: `prime env install {env_id}` (Environments Hub), "
            f"`pip install -e path/to/environments/{env_id}`, or put the folder holding its module on PYTHONPATH."
        ) from error


def _merged(base: Dict[str, Any], override: Mapping[str, Any]) -> Dict[str, Any]:
    for key, value in override.items():
        base[key] = _merged(dict(base.get(key) or {}), value) if isinstance(value, Mapping) and isinstance(base.get(key), Mapping) else value
    return base


def check_drivable_v1(environment: V1Env) -> None:
    """Refuse what the adapter cannot play, naming what is missing (see the module docstring).

    Raises:
        TypeError: several agents, a harness other than verifiers' chat loop, or a sandbox runtime.
    """
    agents = agent_config_fields(environment.config)
    if len(agents) != 1:
        raise TypeError(
            f"verifiers_env: {type(environment).__name__} runs {len(agents)} agents ({', '.join(agents)}); textenv trains one "
            "conversation per episode, so it plays single-agent envs only."
        )
    (role, agent), = agents.items()
    harness, runtime = agent.harness.id or "", getattr(agent.runtime, "type", None)
    if harness not in DRIVABLE_HARNESSES:
        raise TypeError(
            f"verifiers_env: agent {role!r} uses the {harness!r} harness, a program of its own (a coding agent or an external "
            f"agent) that textenv cannot drive turn by turn; textenv drives verifiers' chat loop: load the env with "
            f"agent.harness.id={DRIVABLE_HARNESSES[0]!r} (load_v1_environment's default)."
        )
    if runtime not in LOCAL_RUNTIMES:
        raise TypeError(
            f"verifiers_env: agent {role!r} runs on the {runtime!r} runtime, a sandbox service textenv does not provide; load "
            f"the env with agent.runtime.type={LOCAL_RUNTIMES[0]!r} (load_v1_environment's default)."
        )


@contextmanager
def _subprocess_environment(module: str) -> Iterator[None]:
    """$PYTHONPATH and $PATH for verifiers' subprocesses while the env serves: the taskset's folder (see
    `_subprocess_path`), and this environment's `bin` when `uv` is installed there but not on $PATH (verifiers
    would otherwise try to install uv with pip or curl)."""
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "PATH")}
    os.environ["PYTHONPATH"] = _subprocess_path(module, saved["PYTHONPATH"])
    own_bin = os.path.dirname(sys.executable)
    if shutil.which("uv") is None and os.path.exists(os.path.join(own_bin, "uv")):
        os.environ["PATH"] = os.pathsep.join([own_bin, saved["PATH"] or ""])
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def prepare_chat_harness() -> None:
    """Install the packages of verifiers' chat program (its uv script: openai, mcp, httpx, tenacity; about 60 MB
    into uv's cache) now, as verifiers does at an episode's first setup; for a set-up step before going offline."""
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessConfig, SubprocessRuntime

    runtime = SubprocessRuntime(SubprocessConfig())
    with _subprocess_environment(__name__):
        await runtime.start()
        try:
            await runtime.prepare_uv_script(CHAT_PROGRAM_SOURCE)
        finally:
            await runtime.stop()


def _subprocess_path(module: str, python_path: Optional[str]) -> str:
    """$PYTHONPATH for verifiers' subprocesses (the task's tool servers import the taskset's module): the folder
    this process imported the taskset from is added when it is not an installed package's (a folder put on
    `sys.path`, as the examples do)."""
    entries = [entry for entry in (python_path or "").split(os.pathsep) if entry]
    spec = importlib.util.find_spec(module.split(".")[0])
    origin = spec.origin if spec is not None and spec.origin else None
    if origin is not None:
        top = os.path.dirname(origin) if not origin.endswith("__init__.py") else os.path.dirname(os.path.dirname(origin))
        if "site-packages" not in top and top not in entries:
            entries.append(top)
    return os.pathsep.join(entries)


def task_rows(environment: V1Env) -> List[Dict[str, Any]]:
    """The taskset's tasks as rows (their data as JSON), what `V1Episode` rebuilds each task from."""
    return [task.data.model_dump(mode="json", exclude_none=True) for task in environment.taskset]


class V1Environments(SimpleKind):
    """The v1 env of a `GymScheduler` (the environment kind ``"verifiers-v1"``), checked once; its endpoint and verifiers' serving resources live for one
    `GymScheduler.run` (`serving`); one `V1Episode` per episode.

    Args:
        environment: a v1 `Env` (`load_v1_environment`, or verifiers' own `load_environment`).
        model_name (`str`): the model name requests carry and traces record.
        sampling (`dict`): what the rollouts record as sampling (``max_tokens``, ``temperature``); textenv's
            `generation_kwargs` decide how turns are generated.
    """

    kind = "verifiers-v1"
    ends_its_episodes = True  # the environment's own max_turns and stop conditions

    def __init__(self, environment: V1Env, model_name: str = "textenv", sampling: Optional[dict] = None):
        check_drivable_v1(environment)
        self.environment = environment
        self.model_name = model_name
        self.sampling = SamplingConfig(**{key: value for key, value in (sampling or {}).items() if value is not None})
        self.name = environment.config.env_id or type(environment).__name__
        self.endpoint = EpisodeEndpoint(model_name)

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """The endpoint and verifiers' own serving resources (interception server, shared tool servers)."""
        await self.endpoint.start()
        try:
            with _subprocess_environment(type(self.environment.taskset).__module__):
                async with self.environment.serving():
                    yield
        finally:
            await self.endpoint.stop()

    def adapter(self, row: Mapping[str, Any], index: int) -> "V1Episode":
        return V1Episode(self, row)

    def env_name(self, row: Mapping[str, Any]) -> str:
        return self.name

    def group_scoring(self, num_generations: int, finish, timeout: Optional[float]) -> None:
        """v1 scores each trace inside its episode: no group step."""
        return None

    def task(self, row: Mapping[str, Any]) -> Any:
        """The taskset's task for `row` (a row of `task_rows`, or any row its task data validates)."""
        taskset = self.environment.taskset
        task_type = type(taskset).task_type()
        return task_type(task_type.data_type().model_validate(dict(row)), taskset.config.task)


class V1Episode(Env):
    """One episode of a v1 env as a Gym `Env` (see the module docstring).

    Attributes:
        episode: verifiers' `Episode` once `run_episode` returned (`None` before).
        tool_schemas (`list[dict]`, *optional*): the tools of the first request, after `reset`.
    """

    def __init__(self, environments: V1Environments, row: Mapping[str, Any]):
        super().__init__({"name": environments.name})
        self.environments = environments
        self.row = dict(row)
        self.episode: Any = None
        self.reward_info: Dict[str, Any] = {}
        self._requests: asyncio.Queue = asyncio.Queue()
        self._reply: Optional[asyncio.Future] = None
        self._run: Optional[asyncio.Task] = None
        self._url = ""
        self._sent: List[Dict[str, Any]] = []  # the messages of the last request
        self._turn = 0

    # ------------------------------------------------------------------ the endpoint's side
    async def answer(self, body: Dict[str, Any]) -> ChatReply:
        """A request of the harness (through the endpoint): wait for textenv's turn."""
        self._reply = asyncio.get_running_loop().create_future()
        self._requests.put_nowait(body)
        return await self._reply

    async def _next_request(self) -> Optional[Dict[str, Any]]:
        """The harness's next request body, or `None` once the episode has ended."""
        getter = asyncio.ensure_future(self._requests.get())
        await asyncio.wait({getter, self._run}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        getter.cancel()
        self.episode = self._run.result()  # raises what ended the run, if anything did
        return None

    # ------------------------------------------------------------------ the Gym side
    async def reset(self, config: RolloutInferRequest) -> Tuple[Messages, Dict[str, Any], None]:
        environments = self.environments
        task = environments.task(self.row)
        self._url = environments.endpoint.register(self)
        context = ModelContext(model=environments.model_name, client=EvalClientConfig(base_url=self._url, api_key_var="TEXTENV_ENDPOINT_KEY"),
                               sampling=environments.sampling)
        self._run = asyncio.ensure_future(environments.environment.run_episode(task, context))
        body = await self._next_request()
        if body is None:
            raise RuntimeError(f"the verifiers episode ended before asking the model: {_errors(self.episode) or 'no error recorded'}")
        self._sent = list(body.get("messages") or [])
        self.tool_schemas = list(body.get("tools") or []) or None
        info = {"environment": environments.name, "task": task.key, "tools": [tool["function"]["name"] for tool in self.tool_schemas or []]}
        return chat_dicts(self._sent, "the episode's first request"), info, None

    async def step(self, action: Messages, completion: Any = None) -> Tuple[Optional[Messages], float, bool, Dict[str, Any]]:
        reply = action[-1]
        self._turn += 1
        calls = [wire_tool_call(call) for call in reply.get("tool_calls") or []]
        finish_reason = "length" if getattr(completion, "finish_reason", None) == FINISH_LENGTH else ("tool_calls" if calls else "stop")
        completion_tokens = len(completion.token_ids) if completion is not None else 0
        self._reply.set_result(ChatReply(reply.get("content") or "", calls, finish_reason, completion_tokens=completion_tokens))
        body = await self._next_request()
        if body is None:
            return None, 0.0, True, {"tool_calls": tool_call_records(reply.get("tool_calls") or [], [])} if calls else {}
        messages = list(body.get("messages") or [])
        new_messages = self._new_messages(messages)
        self._sent = messages
        observation = chat_dicts(new_messages, f"the request after turn {self._turn}", {call["id"]: call["function"]["name"] for call in calls})
        wrong = [message["role"] for message in observation if message["role"] not in ("user", "tool")]
        if not observation or wrong:
            raise ValueError(f"turn {self._turn}: the harness answered with roles {wrong or 'nothing'}; textenv appends tool and "
                             "user messages after a model turn.")
        return observation, 0.0, False, {"tool_calls": tool_call_records(reply.get("tool_calls") or [], observation)} if calls else {}

    def _new_messages(self, messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """What the harness added after the reply. It must have kept the conversation: the messages it sent
        before, then one assistant message (the reply as it echoes it: textenv keeps its own tokens)."""
        kept = len(self._sent) + 1
        if len(messages) < kept or messages[: len(self._sent)] != self._sent or messages[len(self._sent)].get("role") != "assistant":
            raise ValueError(
                f"turn {self._turn}: the harness's next request does not extend the conversation (compaction, or a harness that "
                "rewrites earlier messages); textenv trains the exact tokens of one growing conversation."
            )
        return messages[kept:]

    async def final_reward(self, messages: Messages) -> Optional[float]:
        """The trace's reward once verifiers has scored the episode (an episode textenv cut short at its
        `max_length` is ended first, as a model out of context would end it)."""
        await self._end_run()
        episode = self.episode = self._run.result()
        trace = episode.traces[0] if episode.traces else None
        self.reward_info = {
            "reward": trace.reward if trace is not None else None,
            "rewards": {name: reward.score if reward is not None else None for name, reward in trace.rewards.items()} if trace is not None else {},
            "metrics": dict(trace.metrics) if trace is not None else {},
            "stop_condition": trace.stop_condition if trace is not None else None,
            "task": episode.task.key,
        }
        errors = _errors(episode)
        if errors:
            self.reward_info["errors"] = errors
        return None if trace is None else float(trace.reward)

    async def _end_run(self) -> None:
        if self._run is None or self._run.done():
            return
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(ContextOverflow("the episode reached the scheduler's max_length"))
        await asyncio.wait({self._run}, timeout=CLOSE_GRACE_SECONDS)
        if not self._run.done():
            raise TimeoutError(f"the verifiers episode did not end within {CLOSE_GRACE_SECONDS:g} s of textenv's last turn")

    async def close(self) -> None:
        self.environments.endpoint.unregister(self._url)
        if self._run is None or self._run.done():
            return
        try:
            await self._end_run()
        except TimeoutError:
            self._run.cancel()
            await asyncio.wait({self._run}, timeout=CLOSE_GRACE_SECONDS)


def wire_tool_call(call: Dict[str, Any]) -> Dict[str, Any]:
    """A tool call of textenv's transcript as OpenAI's API sends it: arguments as a JSON string (a call textenv
    could not read keeps its raw text, so the harness answers the parse error), no parse `error` field."""
    function = dict(call.get("function") or {})
    if not isinstance(function.get("arguments"), str):
        function["arguments"] = json.dumps(function.get("arguments"), ensure_ascii=False)
    return {"id": call.get("id", ""), "type": "function", "function": {"name": function.get("name") or "", "arguments": function["arguments"]}}


def _errors(episode: Any) -> List[str]:
    if episode is None:
        return []
    found = [*episode.errors, *(error for trace in episode.traces for error in trace.errors)]
    return [f"{error.type}: {error.message}" for error in found]
