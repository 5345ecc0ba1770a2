"""TRL 1.x environments in the Gym front end: what `trl.GRPOTrainer(environment_factory=..., tools=...,
reward_funcs=...)` takes, run unchanged by `GymScheduler`.

A TRL environment is a plain class: ``reset(**row)`` starts a rollout (a returned string is appended to the
last message of the row's `prompt`), its public methods are the tools the model may call (described to the
chat template from their signatures and Google-style docstrings), and an optional ``get_reward()`` scores the
finished rollout. `TrlEnvironment` wraps one instance per episode as a Gym `Env`:

- the opening is the row's `prompt` (TRL's default ``[{"role": "user", "content": ""}]`` without one) with
  `reset`'s string appended to its last message;
- each reply's JSON tool calls (parsed by the chat template's tool parser) call the bound methods and the
  standalone `tools`; a result comes back as ``{"role": "tool", "name", "content": str(result)}`` (plus the
  call's `tool_call_id`), a failing call or unknown tool as ``str({"error": str(e)})``, as TRL does;
- a reply without a tool call ends the episode; `final_reward` then calls each reward function once and then
  `get_reward()` once (if the class defines it), TRL 1.16's order and arguments, and their sum is the episode's
  final reward.

Sync code of an environment (its construction, `reset`, tools, `get_reward`) runs on one thread of its own
per episode, so episodes go on concurrently and each instance sees a single thread, as in TRL; async tools
and an async `get_reward` run on the episode loop.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from textenv.environments.kind import SimpleKind
from textenv.gym.env import Env, Messages, RolloutInferRequest
from textenv.environments.environment_thread import EnvironmentThread
from textenv.gym.registry import load_object
from textenv.gym.rows import REQUEST_COLUMNS
from textenv.tools.json_calls import ToolCallRecord, _decode_arguments, call_id

EnvironmentFactory = Callable[[], Any]
ENVIRONMENT_FIELD = "environment"  # the row field that picks an environment when the factory is a dict
RESERVED_METHODS = ("reset", "get_reward")  # public methods that are not tools
DEFAULT_PROMPT = [{"role": "user", "content": ""}]  # TRL's prompt for a row without one
NOT_REWARD_COLUMNS = ("prompt", "completion", "completion_ids")  # columns TRL does not pass to reward functions


def tool_methods(instance: Any) -> List[Callable]:
    """The tools of an environment instance as TRL finds them: the functions defined on its class (listed on
    the class, so properties are not evaluated), except `reset`, `get_reward` and names starting with ``_``,
    bound to the instance."""
    return [
        getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in RESERVED_METHODS and not name.startswith("_")
    ]


def tool_schemas(tools: Sequence[Callable], owner: str) -> List[dict]:
    """The JSON schemas the chat template gets for `tools` (transformers' `get_json_schema`, what
    `apply_chat_template(tools=[function])` uses).

    Raises:
        ValueError: a tool lacks the type hints or the docstring `get_json_schema` needs (names it).
    """
    from transformers.utils import get_json_schema

    schemas = []
    for tool in tools:
        try:
            schemas.append(get_json_schema(tool))
        except Exception as error:  # noqa: BLE001 - transformers raises several types; name the tool
            raise ValueError(f"{owner}: tool {getattr(tool, '__name__', tool)!r} cannot be described to the model: {error}") from error
    return schemas


def defines(instance: Any, name: str) -> bool:
    """Whether the class of `instance` defines a function `name` (how TRL looks for `get_reward`)."""
    return any(member == name for member, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction))


class TrlEnvironments(SimpleKind):
    """The `environment_factory`, `tools` and `reward_funcs` of a `GymScheduler`, checked once; one
    `TrlEnvironment` per episode (the environment kind ``"trl"``).

    As `trl.GRPOTrainer` does, one probe instance per factory is built here to check it (a callable `reset`)
    and to read its tools; the probe is then dropped (every episode builds its own instance, on its own
    thread).

    Args:
        environment_factory (`Callable` or `dict[str, Callable]`): a class or callable returning an
            environment, or a dict mapping names to such callables; each row's `environment` field then picks
            one, and only that environment's tools are offered in its episodes.
        tools (`list[Callable]`, *optional*): standalone tool functions (sync or async), offered in every
            episode besides the environment's methods.
        reward_funcs (`Callable` or `list[Callable]`, *optional*): TRL reward functions
            ``f(prompts, completions, **kwargs) -> list[float]``; required for an environment without
            `get_reward`.

    Raises:
        TypeError: a factory, tool or reward function that is not callable.
        RuntimeError: building the probe instance failed.
        ValueError: an empty dict, an instance without a callable `reset`, an environment with neither
            `get_reward` nor `reward_funcs`, a tool that cannot be described, two tools with one name.
    """

    kind = "trl"

    def __init__(
        self,
        environment_factory: Union[EnvironmentFactory, Mapping[str, EnvironmentFactory]],
        tools: Optional[Sequence[Callable]] = None,
        reward_funcs: Union[Callable, Sequence[Callable], None] = None,
    ):
        self.multi_environment = isinstance(environment_factory, Mapping)
        factories = dict(environment_factory) if self.multi_environment else {None: environment_factory}
        if not factories:
            raise ValueError("environment_factory: the dict is empty; map at least one name to an environment class.")
        self.tools = as_functions(list(tools or []), "tools")
        self.reward_funcs = as_functions(reward_funcs, "reward_funcs")
        tool_schemas(self.tools, "tools")
        _check_unique([tool.__name__ for tool in self.tools], "tools")
        self.factories: Dict[Optional[str], EnvironmentFactory] = {}
        self.labels: Dict[Optional[str], str] = {}
        for name, factory in factories.items():
            where = "environment_factory" if name is None else f"environment_factory[{name!r}]"
            if not callable(factory):
                raise TypeError(f"{where} is a {type(factory).__name__}; expected a class or a callable returning an environment.")
            try:
                probe = factory()
            except Exception as error:
                raise RuntimeError(f"{where}: building an instance to check it failed: {type(error).__name__}: {error}") from error
            if not callable(getattr(probe, "reset", None)):
                raise ValueError(f"{where}: each environment instance must define a callable `reset` ({type(probe).__name__} does not).")
            if not defines(probe, "get_reward") and not self.reward_funcs:
                raise ValueError(
                    f"{where}: {type(probe).__name__} defines no `get_reward` method, so the episode reward must come from "
                    "reward functions: pass reward_funcs=[f, ...] (f(prompts, completions, **kwargs) -> list[float]), or define "
                    "get_reward(self) -> float on the environment."
                )
            methods = tool_methods(probe)
            tool_schemas(methods, f"{where} ({type(probe).__name__})")
            _check_unique([tool.__name__ for tool in self.tools + methods], f"{where} and tools")
            self.factories[name] = factory
            self.labels[name] = name if name is not None else type(probe).__name__

    @property
    def names(self) -> List[str]:
        """The environment names of a dict factory (empty for a single one)."""
        return [name for name in self.factories if name is not None]

    def env_name(self, row: Mapping[str, Any]) -> Optional[str]:
        """The name an episode of `row` is logged under: its `environment` field (dict factory) or the class name."""
        return row.get(ENVIRONMENT_FIELD) if self.multi_environment else self.labels[None]

    def adapter(self, row: Mapping[str, Any], index: int = 0) -> "TrlEnvironment":
        """A `TrlEnvironment` for one episode of `row` (no instance is built until its `reset`).

        Raises:
            ValueError: with a dict factory, the row has no `environment` field or names an unknown one.
        """
        name = None
        if self.multi_environment:
            name = row.get(ENVIRONMENT_FIELD)
            if name is None:
                raise ValueError(f"the row has no {ENVIRONMENT_FIELD!r} field; environment_factory is a dict, so each row must name one of {self.names}.")
            if name not in self.factories:
                raise ValueError(f"the row has {ENVIRONMENT_FIELD}={name!r}, which is not among the environments passed to environment_factory. Expected one of: {self.names}.")
        return TrlEnvironment(self.factories[name], name=self.labels[name], tools=self.tools, reward_funcs=self.reward_funcs,
                              row=row, multi_environment=self.multi_environment)


class TrlEnvironment(Env):
    """One episode of a TRL environment as a Gym `Env` (see the module docstring for the rules).

    Args:
        factory (`Callable`): builds the environment instance (called in `reset`, on the episode's thread).
        name (`str`, *optional*): the environment's name (logged in the reset info).
        tools (`list[Callable]`): standalone tools offered besides the instance's methods.
        reward_funcs (`list[Callable]`): TRL reward functions added to `get_reward`.
        row (`Mapping`, *optional*): the dataset row; default: rebuilt from `reset`'s request.
        multi_environment (`bool`): the factory was a dict, so the row's `environment` field is not passed to
            `reset` (as in TRL).

    Attributes:
        instance: the environment instance (after `reset`).
        opening (`list[dict]`): the opening messages (after `reset`); the rest of the conversation is the
            completion the reward functions see.
        tool_schemas (`list[dict]`, *optional*): the tools' JSON schemas (after `reset`; `None` without tools).
    """

    def __init__(
        self,
        factory: EnvironmentFactory,
        *,
        name: Optional[str] = None,
        tools: Sequence[Callable] = (),
        reward_funcs: Sequence[Callable] = (),
        row: Optional[Mapping[str, Any]] = None,
        multi_environment: bool = False,
    ):
        super().__init__({"name": name})
        self.factory = factory
        self.name = name
        self.standalone_tools = list(tools)
        self.reward_funcs = list(reward_funcs)
        self.row = dict(row) if row is not None else None
        self.multi_environment = multi_environment
        self.instance: Any = None
        self.reward_info: Dict[str, Any] = {}
        self.opening: Messages = []
        self.functions: Dict[str, Callable] = {}
        self._thread = EnvironmentThread()

    async def reset(self, config: RolloutInferRequest) -> Tuple[Messages, Dict[str, Any], None]:
        if self.row is None:
            self.row = row_of_request(config)
        self.instance = await self._call(self.factory)
        kwargs = {key: value for key, value in self.row.items() if not (self.multi_environment and key == ENVIRONMENT_FIELD)}
        observation = await self._call(self.instance.reset, **kwargs)
        self.opening = opening_messages(self.row.get("prompt"), observation, type(self.instance).__name__)
        tools = [*self.standalone_tools, *tool_methods(self.instance)]
        self.functions = {tool.__name__: tool for tool in tools}
        self.tool_schemas = tool_schemas(tools, type(self.instance).__name__) or None
        return copy.deepcopy(self.opening), {"environment": self.name, "tools": list(self.functions)}, None

    async def step(self, action: Messages) -> Tuple[Optional[Messages], float, bool, Dict[str, Any]]:
        calls = action[-1].get("tool_calls")
        if not calls:
            return None, 0.0, True, {}
        messages, records = await run_tool_calls(calls, self._invoke)
        return messages, 0.0, False, {"tool_calls": records}

    async def final_reward(self, messages: Messages, completion_ids: Optional[List[int]] = None, step: int = 0) -> float:
        """The episode's reward as TRL 1.16's `GRPOTrainer` computes it: each reward function, then `get_reward()`
        (TRL appends it to the reward functions when the class defines it), summed with weight 1 (a `None`
        counts 0, as TRL ignores it). The reward functions are called as `reward_funcs_total` says, with
        ``environments=[instance]``."""
        prompt, completion = messages[: len(self.opening)], messages[len(self.opening) :]
        total = await reward_funcs_total(self.reward_funcs, self._call, prompt=prompt, completion=completion, completion_ids=completion_ids,
                                         row=self.row, step=step, reward_info=self.reward_info, environment=self.instance)
        if defines(self.instance, "get_reward"):
            total += _as_reward(await self._call(self.instance.get_reward), "get_reward")
        return total

    async def close(self) -> None:
        self._thread.stop()

    async def _invoke(self, name: str, arguments: Any) -> Tuple[str, None]:
        """Call a tool as TRL does: ``tool(**arguments)`` (what fails answers the model, see `run_tool_call`)."""
        if name not in self.functions:
            raise ValueError(f"Tool {name} not found.")
        return str(await self._call(self.functions[name], **arguments)), None

    async def _call(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        return await call_environment_code(self._thread, function, *args, **kwargs)


async def call_environment_code(thread: EnvironmentThread, function: Callable, *args: Any, **kwargs: Any) -> Any:
    """Await an async function on the episode loop; run a sync one on the episode's own `thread`."""
    if inspect.iscoroutinefunction(function):
        return await function(*args, **kwargs)
    result = await thread.run(function, *args, **kwargs)
    return await result if inspect.isawaitable(result) else result


ToolInvoker = Callable[[str, Any], Awaitable[Tuple[str, Optional[str]]]]


async def run_tool_calls(calls: Sequence[Any], invoke: ToolInvoker, passes: Tuple[type, ...] = ()) -> Tuple[Messages, List[dict]]:
    """A reply's parsed calls run in order (`run_tool_call`): the tool messages that answer them, and their records."""
    messages, records = [], []
    for index, call in enumerate(calls):
        record = await run_tool_call(call, index, invoke, passes)
        records.append(record.as_dict())
        messages.append({"role": "tool", "tool_call_id": record.id, "name": record.name, "content": record.result})
    return messages, records


async def run_tool_call(call: Any, index: int, invoke: ToolInvoker, passes: Tuple[type, ...] = ()) -> ToolCallRecord:
    """Run one parsed OpenAI-style call (the `index`-th of its turn) with ``await invoke(name, arguments) -> (result,
    error or None)`` and record it. A failure (an unreadable call, arguments that are not JSON, what `invoke` raised
    except the `passes` types, which end the episode) answers the model ``str({"error": str(e)})``, as TRL does."""
    call = call if isinstance(call, dict) else {}
    function = call.get("function", call)
    identifier = str(call.get("id") or call_id(index))
    name, arguments = function.get("name") or "", function.get("arguments", {})
    try:
        if call.get("error"):
            raise ValueError(f"the tool call could not be read ({call['error']})")
        if isinstance(arguments, str):
            arguments, problem = _decode_arguments(arguments)
            if problem:
                raise ValueError(problem)
        result, error = await invoke(name, arguments)
    except passes:
        raise
    except Exception as error:  # noqa: BLE001 - a failing tool is the model's problem, as in TRL
        return ToolCallRecord(identifier, name, arguments, str({"error": str(error)}), str(error))
    return ToolCallRecord(identifier, name, arguments, result, error)


async def reward_funcs_total(reward_funcs: Sequence[Callable], call: Callable[..., Awaitable[Any]], *, prompt: Messages, completion: Messages,
                             completion_ids: Optional[List[int]], row: Mapping[str, Any], step: int, reward_info: Dict[str, Any],
                             environment: Any) -> float:
    """The sum of TRL reward functions for one episode, each run by ``await call(function, **arguments)`` as TRL 1.16
    calls it for a batch of this one episode: ``prompts=[prompt]``, ``completions=[completion]``,
    ``completion_ids=[the token ids after the prompt]``, the row's other columns as one-element lists,
    ``trainer_state`` (a `transformers.TrainerState` at `step`), ``log_extra(column, values)`` and
    ``log_metric(name, value)`` (kept in `reward_info`, which the episode's last trajectory info and
    `completions.jsonl` carry) and ``environments=[environment]``. A function that does not return one float
    (or `None`, counted 0) in a list raises `ValueError` / `TypeError`."""
    from transformers import TrainerState

    def log_extra(column: str, values: Sequence[Any]) -> None:  # TRL's: a column of the completions table
        reward_info.setdefault("log_extra", {})[column] = list(values)[0] if len(values) == 1 else list(values)

    def log_metric(name: str, value: float) -> None:  # TRL's: a scalar a reward function reports
        reward_info.setdefault("log_metric", {})[name] = value

    columns = {key: [value] for key, value in row.items() if key not in NOT_REWARD_COLUMNS}
    arguments = dict(prompts=[prompt], completions=[completion], completion_ids=[list(completion_ids or [])], **columns,
                     trainer_state=TrainerState(global_step=step), log_extra=log_extra, log_metric=log_metric,
                     environments=[environment])
    total = 0.0
    for function in reward_funcs:
        values = await call(function, **arguments)
        if not isinstance(values, (list, tuple)) or len(values) != 1:
            raise ValueError(f"reward function {getattr(function, '__name__', function)!r} returned {values!r}; expected a list with one reward per completion (here one).")
        total += _as_reward(values[0], getattr(function, "__name__", "reward function"))
    return total


def opening_messages(prompt: Any, observation: Any, owner: str) -> Messages:
    """The row's `prompt` as messages (a string is one user message; none is TRL's empty user message), with
    `observation` (what `reset` returned: a string, or `None` for nothing) appended to the last one's content.

    Raises:
        TypeError: a prompt that is not a string or a list of messages, or an observation that is not a
            string or `None`.
    """
    if prompt is None:
        messages = copy.deepcopy(DEFAULT_PROMPT)
    elif isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and prompt and all(isinstance(message, Mapping) for message in prompt):
        messages = [dict(copy.deepcopy(message)) for message in prompt]
    else:
        raise TypeError(f"the row's prompt is {type(prompt).__name__} {prompt!r:.80}; expected a list of chat messages or a string.")
    if observation is None:
        return messages
    if not isinstance(observation, str):
        raise TypeError(f"{owner}.reset returned a {type(observation).__name__}; expected a string (appended to the prompt) or None.")
    messages[-1]["content"] = messages[-1].get("content", "") + observation
    return messages


def row_of_request(request: RolloutInferRequest) -> Dict[str, Any]:
    """The dataset row a request was made from (its columns; request fields left at their defaults are left out)."""
    defaults = RolloutInferRequest()
    row = {column: getattr(request, column) for column in REQUEST_COLUMNS if getattr(request, column) != getattr(defaults, column)}
    return {**row, **request.data_dict}


def load_environment_factory(text: str) -> Union[Any, Dict[str, Any]]:
    """``--environment_factory``: ``module:Class`` (one environment) or ``name=module:Class,name2=file.py:Class``
    (a dict: rows pick one with their `environment` field)."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    named = [item.partition("=") for item in items]
    if len(items) == 1 and not named[0][1]:
        return load_object(items[0], "--environment_factory")
    if not all(sep and name.strip() for name, sep, _ in named):
        raise ValueError(f"--environment_factory {text!r}: give one module:Class, or name=module:Class for every environment.")
    return {name.strip(): load_object(spec, "--environment_factory") for name, _, spec in named}


def load_functions(text: Optional[str], option: str) -> List[Callable]:
    """``--tools`` / ``--reward_funcs``: comma-separated ``module:function`` or ``file.py:function`` specs."""
    return [load_object(item, option) for item in (text or "").split(",") if item.strip()]


def as_functions(value: Union[Callable, Sequence[Callable], None], label: str) -> List[Callable]:
    """`value` (a function, a list of them, or `None`) as a list; an item that is not callable raises a `TypeError`
    naming `label` (TRL's reward model ids and models are not taken here)."""
    functions = [value] if callable(value) else list(value or [])
    for item in functions:
        if not callable(item):
            raise TypeError(f"{label}: {item!r} is a {type(item).__name__}, not a function.")
    return functions


def _as_reward(value: Any, source: str) -> float:
    if value is None:
        return 0.0
    try:
        return float(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{source} returned {value!r}; expected a float.") from error


def _check_unique(names: List[str], where: str) -> None:
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{where}: several tools are named {repeated}; the model calls tools by name, so names must be unique.")
