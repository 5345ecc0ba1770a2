"""verifiers environments in the Gym front end: ``GymScheduler(verifiers_env=vf.load_environment(ID, **args))``.

verifiers' own rollout code plays each episode: `Environment.rollout` (its `setup_state`, `env_response`,
tools, `@vf.stop` conditions, `max_turns`, `cleanup`) and, once a row's episodes have all ended, its rubric's
`score_group` (reward functions, weights, group functions, metrics), as `Environment.generate` does by
default. Only the model is textenv's: the rollout asks an `EpisodeClient` for each turn, and that question
becomes a turn of textenv's episode driver, so every turn is generated on textenv's engine (in-process or
vLLM) from the episode's exact token ids, and the history trained is the one generated.

`VerifiersEnvironment` is one episode as a Gym `Env`: `reset` starts the rollout and returns the messages of
its first model request (system prompt, few-shot, the question); `step` hands the reply to the rollout and
returns what it sends next (its `env_response`: tool or user messages), or ``done`` when the rollout ended.
What differs from verifiers' own client loop, by design, is listed in docs/guides/verifiers.md.

verifiers 0.3 is the supported API (its classic environments; `textenv[verifiers]`). Importing this module
imports verifiers; `textenv` itself never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from typing import Any, Dict, List, Mapping, Optional, Tuple

import verifiers as vf
from verifiers.legacy.clients.client import Client
from verifiers.legacy.envs.environment import Environment
from verifiers.legacy.errors import EmptyModelResponseError, OverlongPromptError

from textenv.environments.kind import SimpleKind
from textenv.gym.env import Env, Messages, RolloutInferRequest
from textenv.environments.verifiers_messages import chat_dicts, is_v1_environment, model_response, tool_call_records

logger = logging.getLogger(__name__)

CLOSE_GRACE_SECONDS = 10.0  # how long `close` waits for a rollout told to stop to run its cleanup


def load_verifiers_environment(env_id: str, env_args: Optional[Mapping[str, Any]] = None) -> Environment:
    """``vf.load_environment(env_id, **env_args)``, with an error that says how to install a missing environment.

    Raises:
        ModuleNotFoundError: no module of that name is installed (the message names the install commands).
        RuntimeError: the environment's `load_environment` failed (verifiers' message, with the cause).
    """
    module = env_id.replace("-", "_").split("/")[-1]
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name != module:
            raise  # the environment is installed but needs a package that is not
        raise ModuleNotFoundError(
            f"--env_id {env_id!r}: no module {module!r} is installed. Install the environment first: "
            f"`prime env install {env_id}` (Environments Hub), `vf-install {module}` in a verifiers checkout, or "
            f"`pip install -e path/to/environments/{module}`; a folder holding {module}.py can also be put on PYTHONPATH."
        ) from error
    return vf.load_environment(env_id, **dict(env_args or {}))


class EpisodeClient(Client):
    """The verifiers `Client` of one episode: each `get_response` of the rollout is answered by textenv's
    episode driver (the engine generates the turn); nothing goes over a network."""

    def __init__(self, episode: "VerifiersEnvironment"):
        super().__init__(None)
        self.episode = episode

    async def get_response(self, prompt: Messages, model: str, sampling_args: dict, tools: Optional[list] = None, **kwargs: Any):
        return await self.episode.ask_model(prompt, tools, kwargs.get("state"))

    def setup_client(self, config):
        raise NotImplementedError("EpisodeClient generates on textenv's engine; it has no client config.")

    async def to_native_tool(self, tool):
        raise NotImplementedError

    async def to_native_prompt(self, messages):
        raise NotImplementedError

    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        raise NotImplementedError

    async def raise_from_native_response(self, response):
        raise NotImplementedError

    async def from_native_response(self, response):
        raise NotImplementedError

    async def close(self) -> None:
        return None


class VerifiersEnvironments(SimpleKind):
    """The verifiers environment of a `GymScheduler`, checked once; one `VerifiersEnvironment` per episode (the
    environment kind ``"verifiers"``).

    Args:
        environment: a loaded classic verifiers environment (``vf.load_environment(...)``, or built directly).
        model_name (`str`): the model name the rollouts record (``state["model"]``).
        sampling_args (`dict`): what the rollouts record as ``state["sampling_args"]``; textenv's
            `generation_kwargs` decide how turns are generated.

    Raises:
        TypeError: not a classic verifiers `Environment` (a v1 `Env` is refused with what it would need).
        ValueError: a completion-format environment (``message_type="completion"``, deprecated in verifiers).
    """

    kind = "verifiers"
    ends_its_episodes = True  # the environment's own max_turns and stop conditions

    def __init__(self, environment: Any, model_name: str = "textenv", sampling_args: Optional[dict] = None):
        check_drivable(environment)
        self.environment: Environment = environment
        self.model_name = model_name
        self.sampling_args = dict(sampling_args or {})
        self.name = environment.env_id or type(environment).__name__

    def env_name(self, row: Mapping[str, Any]) -> str:
        return self.name

    def serving(self) -> Any:
        """Nothing to serve: the rollouts ask `EpisodeClient`, in process."""
        return contextlib.nullcontext()

    def group_scoring(self, num_generations: int, finish, timeout: Optional[float]) -> "GroupScoring":
        """Scores each row's episodes together once all have ended (see `GroupScoring`)."""
        return GroupScoring(self, num_generations, finish, timeout)

    def adapter(self, row: Mapping[str, Any], index: int) -> "VerifiersEnvironment":
        """The episode of `row` (row `index` of the run: its `example_id` when the row has none)."""
        return VerifiersEnvironment(self, row, index)

    async def score_group(self, episodes: List["VerifiersEnvironment"], timeout: Optional[float]) -> List[str]:
        """Score one row's finished rollouts with the rubric's `score_group` (then its `cleanup`), as
        verifiers' `Environment.generate` does; returns what the rubric logged as errors (a failing reward
        function scores 0 there, as in verifiers).

        Raises:
            TimeoutError: scoring took longer than `timeout` seconds.
        """
        rubric = self.environment.rubric
        states = [episode.state for episode in episodes]
        with _LoggedErrors() as logged:
            await asyncio.wait_for(rubric.score_group(states), timeout)
            for state in states:
                await asyncio.wait_for(rubric.cleanup(state), timeout)
        return logged.messages


def check_drivable(environment: Any) -> None:
    """Refuse what the adapter cannot play, with the reason (see `VerifiersEnvironments`)."""
    if isinstance(environment, Environment):
        if environment.message_type != "chat":
            raise ValueError(
                f"verifiers_env: {type(environment).__name__} uses message_type={environment.message_type!r}; textenv plays chat "
                "environments (the completion format is deprecated in verifiers 0.3). Load it with message_type='chat'."
            )
        return
    if is_v1_environment(environment):
        raise TypeError(
            f"verifiers_env: {type(environment).__name__} is a verifiers v1 environment; VerifiersEnvironments plays classic "
            "environments (verifiers 0.3). Pass it to GymScheduler(verifiers_env=...) with verifiers 0.4 installed "
            "(textenv.environments.verifiers_v1, pip install 'textenv[verifiers-v1]')."
        )
    raise TypeError(f"verifiers_env: expected a verifiers Environment (vf.load_environment(...)), got {type(environment).__name__}.")


class VerifiersEnvironment(Env):
    """One episode of a verifiers environment as a Gym `Env` (see the module docstring).

    Attributes:
        state: verifiers' rollout state (after the rollout ended; `None` before, or if it was cancelled).
        tool_schemas (`list[dict]`, *optional*): the rollout's tools (``state["tool_defs"]``) as chat-template
            schemas, after `reset`.
    """

    def __init__(self, environments: VerifiersEnvironments, row: Mapping[str, Any], index: int):
        super().__init__({"name": environments.name})
        self.environments = environments
        self.rollout_input = {**dict(row), "example_id": row.get("example_id", index)}
        self.scoring_errors: List[str] = []
        self._requests: asyncio.Queue = asyncio.Queue()
        self._reply: Optional[asyncio.Future] = None
        self._rollout: Optional[asyncio.Task] = None
        self._live_state: Any = None  # the rollout's state, as its last model request passed it
        self._turn = 0

    @property
    def state(self) -> Any:
        """verifiers' state of the rollout once it has returned (`None` while it runs, or if it failed or was cancelled)."""
        rollout = self._rollout
        if rollout is None or not rollout.done() or rollout.cancelled() or rollout.exception() is not None:
            return None
        return rollout.result()

    # ------------------------------------------------------------------ the rollout's side
    async def ask_model(self, prompt: Any, tools: Optional[list], state: Any) -> Any:
        """Called by the rollout (through `EpisodeClient`): wait for textenv's turn on `prompt`."""
        self._live_state = state
        self._reply = asyncio.get_running_loop().create_future()
        self._requests.put_nowait((list(prompt), tools))
        return await self._reply

    async def _next_request(self) -> Optional[Tuple[list, Optional[list]]]:
        """The rollout's next model request, or `None` once it has ended (its exception is raised)."""
        getter = asyncio.ensure_future(self._requests.get())
        await asyncio.wait({getter, self._rollout}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        getter.cancel()
        self._rollout.result()  # raises what ended the rollout, if anything did
        return None

    # ------------------------------------------------------------------ the Gym side
    async def reset(self, config: RolloutInferRequest) -> Tuple[Messages, Dict[str, Any], None]:
        if not isinstance(self.rollout_input.get("prompt"), (list, str)):
            raise ValueError(
                "the row has no `prompt`: pass the rows verifiers formats (environment.get_dataset() or get_eval_dataset(): "
                "they hold `prompt`, `answer`, `info`, `example_id`), not the raw dataset."
            )
        environments = self.environments
        self._rollout = asyncio.ensure_future(environments.environment.rollout(
            self.rollout_input, EpisodeClient(self), environments.model_name, dict(environments.sampling_args)))
        request = await self._next_request()
        if request is None:
            raise RuntimeError(f"the verifiers rollout ended before asking the model (stop condition "
                               f"{self.state.get('stop_condition')!r}, error {self.state.get('error')!r}).")
        prompt, tools = request
        self.tool_schemas = [{"type": "function", "function": tool.model_dump(exclude_none=True)} for tool in tools or []] or None
        info = {"environment": environments.name, "tools": [tool.name for tool in tools or []]}
        return chat_dicts(prompt, "the rollout's first prompt"), info, None

    async def step(self, action: Messages, completion: Any = None) -> Tuple[Optional[Messages], float, bool, Dict[str, Any]]:
        reply = action[-1]
        self._turn += 1
        finish_reason = getattr(completion, "finish_reason", None)
        if not any(reply.get(key) for key in ("content", "tool_calls", "reasoning", "reasoning_content")):
            # what verifiers' own chat client raises for such a reply: the rollout ends with has_error
            self._reply.set_exception(EmptyModelResponseError("Model returned no content and did not call any tools"))
        else:
            self._reply.set_result(model_response(reply, finish_reason, self.environments.model_name, f"{self.rollout_input['example_id']}-{self._turn}"))
        request = await self._next_request()
        calls = reply.get("tool_calls") or []
        if request is None:
            return None, 0.0, True, {"tool_calls": tool_call_records(calls, [])} if calls else {}
        prompt, _ = request
        new_messages = self._new_messages(prompt)
        observation = chat_dicts(new_messages, f"env_response of turn {self._turn}", _call_names(calls))
        wrong = [message["role"] for message in observation if message["role"] not in ("user", "tool")]
        if not observation or wrong:
            raise ValueError(f"turn {self._turn}: the environment answered with roles {wrong or 'nothing'}; textenv appends tool "
                             "and user messages after a model turn.")
        return observation, 0.0, False, {"tool_calls": tool_call_records(calls, observation)} if calls else {}

    def _new_messages(self, prompt: list) -> list:
        """The messages the rollout added after the last reply; it must have kept the conversation so far
        (textenv trains the tokens it generated, so a rewritten history cannot be followed)."""
        last = self._live_state["trajectory"][-1]
        kept = [*last["prompt"], *last["completion"]]
        if len(prompt) < len(kept) or [_dump(m) for m in prompt[: len(kept)]] != [_dump(m) for m in kept]:
            raise ValueError(
                f"turn {self._turn}: the environment's next prompt does not extend the conversation (a get_prompt_messages "
                "override that rewrites earlier messages?); textenv trains the exact tokens of one growing conversation."
            )
        return prompt[len(kept):]

    async def close(self) -> None:
        if self._rollout is None or self._rollout.done():
            return
        if self._reply is not None and not self._reply.done() and self._requests.empty():
            # the episode ended while the rollout waited for a turn (textenv's max_length): verifiers' own
            # signal for a prompt that does not fit, so its stop conditions and cleanup run
            self._reply.set_exception(OverlongPromptError("the context reached the scheduler's max_length"))
            await asyncio.wait({self._rollout}, timeout=CLOSE_GRACE_SECONDS)
        if not self._rollout.done():
            self._rollout.cancel()
            await asyncio.wait({self._rollout}, timeout=CLOSE_GRACE_SECONDS)

    def final_info(self) -> Dict[str, Any]:
        """What verifiers recorded about the finished rollout, for the episode's last trajectory info."""
        state = self.state
        info = {"reward": state.get("reward"), "metrics": state.get("metrics"), "stop_condition": state.get("stop_condition"),
                "is_truncated": state.get("is_truncated")}
        if state.get("error") is not None:
            info["error"] = repr(state["error"])
        if self.scoring_errors:
            info["scoring_errors"] = list(self.scoring_errors)
        return info


def _dump(message: Any) -> Any:
    return message if isinstance(message, dict) else message.model_dump(exclude_none=True)


def _call_names(calls: List[Dict[str, Any]]) -> Dict[str, str]:
    return {call.get("id"): call.get("function", {}).get("name", "") for call in calls}


class _LoggedErrors(logging.Handler):
    """Collects the errors verifiers logs while scoring (a reward function that raised scores 0 there)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> "_LoggedErrors":
        logging.getLogger("verifiers").addHandler(self)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        logging.getLogger("verifiers").removeHandler(self)


class GroupScoring:
    """Holds each row's finished episodes until all `num_generations` have ended, then scores them together
    (`VerifiersEnvironments.score_group`) and hands each to `finish(index, play)` in the order they ended.

    An episode that failed in textenv (a timeout, an exception from `env_response`) is not scored: it keeps its
    error and no reward; the row's other episodes are scored as a smaller group. A scoring failure or timeout
    is recorded in each episode of the group (stage ``"score"``).
    """

    def __init__(self, environments: VerifiersEnvironments, num_generations: int, finish, timeout: Optional[float]):
        self.environments = environments
        self.num_generations = num_generations
        self.finish = finish
        self.timeout = timeout
        self.waiting: Dict[int, List[Tuple[int, Any]]] = {}
        self.tasks: set = set()

    def add(self, index: int, play: Any) -> None:
        group = self.waiting.setdefault(play.result.row_index, [])
        group.append((index, play))
        if len(group) == self.num_generations:
            self._start(self.waiting.pop(play.result.row_index))

    def _start(self, group: List[Tuple[int, Any]]) -> None:
        task = asyncio.ensure_future(self._score(group))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _score(self, group: List[Tuple[int, Any]]) -> None:
        from textenv.episodes.driver import FINISH_ERROR, EpisodeFailure

        scored = [play for _, play in group if not play.failures and play.env is not None and play.env.state is not None]
        try:
            if scored:
                errors = await self.environments.score_group([play.env for play in scored], self.timeout)
                for play in scored:
                    play.env.scoring_errors = errors
                    reward = float(play.env.state.get("reward") or 0.0)
                    play.result.final_reward = reward
                    play.result.total_reward += reward
                    play.result.trajectory_infos.append(play.env.final_info())
        except Exception as error:  # noqa: BLE001 - a scoring failure ends this group's episodes only
            failure = error if not isinstance(error, asyncio.TimeoutError) else TimeoutError(f"scoring did not end within {self.timeout:g} s")
            for play in scored:
                play.failures.append(EpisodeFailure("score", failure))
                play.finish_reason = FINISH_ERROR
        finally:
            for index, play in group:
                self.finish(index, play)

    async def wait(self) -> None:
        """Score what is still waiting (groups cut short by a cancelled run are scored as they are), then wait."""
        for row in list(self.waiting):
            self._start(self.waiting.pop(row))
        if self.tasks:
            await asyncio.gather(*list(self.tasks))
