"""`GymArguments`: where Gym episodes come from (the dataset, the environment kind: registered Gym envs, a TRL
environment class, a verifiers environment, an OpenEnv environment or MCP tool servers; plugins; the scheduler's
limits), for `textenv rollout` and `textenv train` (re-exported by `textenv.options`).

textenv.gym is imported only when an option asks for it, so parsing stays fast.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from textenv.options import EpisodeArguments


@dataclass
class GymArguments:
    """Where Gym episodes come from and the scheduler's limits (ms-swift's option names)."""

    dataset: Optional[str] = field(default=None, metadata={"help": "gym rows: a .jsonl / .json file, a datasets folder (save_to_disk) or a hub dataset id"})
    gym_env: Optional[str] = field(default=None, metadata={"help": "env name for rows without env_config.name"})
    context_manager: Optional[str] = field(default=None, metadata={"help": "context manager for rows without ctx_config.name (default dummyContextManager)"})
    external_plugins: list[str] = field(default_factory=list, metadata={"help": "plugin .py files registering envs / context managers"})
    loss_scale: str = field(default="last_round", metadata={"help": "which rounds are trained on: last_round, default or all"})
    max_length: Optional[int] = field(default=None, metadata={"help": "end an episode once its context has this many tokens"})
    max_concurrency: int = field(default=64, metadata={"help": "episodes alive at once"})
    step_timeout: float = field(default=60.0, metadata={"help": "seconds an env reset/step/close may take"})
    environment_factory: Optional[str] = field(
        default=None,
        metadata={"help": "a TRL environment class instead of --gym_env: module:Class or path/to/file.py:Class (name=module:Class,... for several, "
                  "picked by each row's 'environment' field)"},
    )
    tools: Optional[str] = field(default=None, metadata={"help": "with --environment_factory: standalone tool functions, module:func,file.py:func2"})
    reward_funcs: Optional[str] = field(
        default=None, metadata={"help": "with --environment_factory or --mcp_server: TRL reward functions f(prompts, completions, **kwargs), module:f,... (summed)"}
    )
    mcp_server: Optional[str] = field(
        default=None,
        metadata={"help": "MCP tool servers instead of --gym_env: a command line ('python server.py --db {episode_dir}/db.sqlite'; each episode "
                  "gets its own server processes), the URL of a running server (http://host:port/mcp, streamable HTTP: one server, a "
                  "session per episode) or a .json config of several ({\"mcpServers\": {...}}); rewards from --reward_funcs"},
    )
    env_id: Optional[str] = field(default=None, metadata={"help": "--task verifiers: the installed verifiers environment (its id or module name); "
                                                                  "--task openenv: the OpenEnv environment (an installed package's name, module:app, or a server's http URL)"})
    max_sessions: Optional[int] = field(default=None, metadata={"help": "--task openenv: the sessions its server holds at once (default: --max_concurrency)"})
    env_args: Optional[str] = field(default=None, metadata={"help": "--task verifiers: load_environment's keyword arguments, a JSON object (a v1 taskset: its env config, e.g. {\"taskset\": {...}, \"agent\": {\"max_turns\": 4}})"})

    def __post_init__(self) -> None:
        from textenv.chat.transcript import check_loss_scale

        check_loss_scale(self.loss_scale)
        if self.environment_factory and self.gym_env:
            raise ValueError("--gym_env and --environment_factory both choose the env; give one of them.")
        if self.tools and not self.environment_factory:
            raise ValueError("--tools and --reward_funcs go with --environment_factory (TRL environments).")
        if self.reward_funcs and not (self.environment_factory or self.mcp_server):
            raise ValueError("--reward_funcs goes with --environment_factory (TRL environments) or --mcp_server (MCP tool servers).")
        if self.mcp_server and (self.gym_env or self.environment_factory or self.env_id):
            raise ValueError("--mcp_server chooses the env (MCP tool servers); leave out --gym_env, --environment_factory and --env_id.")
        if self.mcp_server and not self.reward_funcs:
            raise ValueError("--mcp_server needs --reward_funcs module:f (the episode's reward: MCP servers give tools, not rewards).")
        if self.env_id and (self.gym_env or self.environment_factory):
            raise ValueError("--env_id (a verifiers or OpenEnv environment) chooses the env; leave out --gym_env and --environment_factory.")
        if self.env_args is not None:
            if not self.env_id:
                raise ValueError("--env_args goes with --env_id (the verifiers environment it configures).")
            _env_args(self.env_args or "{}")

    def _max_turns(self, episode: EpisodeArguments) -> Optional[int]:
        """The scheduler's turn limit (`None`: none); a verifiers environment keeps its own.

        Raises:
            ValueError: `--max_turns` given with `--env_id`.
        """
        if not self.env_id or self.env_kind == "openenv":
            return episode.max_turns or None
        if episode.max_turns_given:
            raise ValueError(f"--max_turns {episode.max_turns} with --env_id: a verifiers environment ends its episodes itself; "
                             f"give its max_turns in --env_args (e.g. '{{\"max_turns\": {episode.max_turns}}}') if it takes one.")
        return None

    env_kind = "verifiers"  # what --env_id names: `check_task` sets "openenv" for --task openenv

    def check_task(self, task: str) -> None:
        """`--task verifiers` or `--task openenv` and `--env_id` go together (`textenv rollout` and `textenv train`).

        Raises:
            ValueError: one without the other, `--max_sessions` without `--task openenv` or below `--max_concurrency`,
                `--mcp_server` without `--task gym`.
        """
        if (task in ("verifiers", "openenv")) != bool(self.env_id):
            named = task if task in ("verifiers", "openenv") else "verifiers"
            raise ValueError(f"--task {named} needs --env_id (the environment), and --env_id needs --task verifiers or --task openenv.")
        if self.max_sessions is not None and task != "openenv":
            raise ValueError("--max_sessions goes with --task openenv (the OpenEnv server's session cap).")
        if self.mcp_server and task != "gym":
            raise ValueError(f"--mcp_server goes with --task gym (the rows of --dataset played with MCP tool servers), not --task {task}.")
        if task == "openenv":
            if self.env_args is not None:
                raise ValueError("--env_args configures a verifiers environment; an OpenEnv environment takes its settings from each row's columns.")
            if self.max_sessions is not None and self.max_sessions < self.max_concurrency:
                raise ValueError(f"--max_sessions {self.max_sessions} is below --max_concurrency {self.max_concurrency}: each live episode holds one "
                                 f"of the server's sessions; pass --max_concurrency {self.max_sessions} too.")
            self.env_kind = "openenv"

    def environment_kind(self):
        """The `GymScheduler`'s `environments`: the OpenEnv environment of ``--task openenv --env_id`` or the MCP
        servers of `--mcp_server` (`None` for the other kinds, which take their own arguments), checked when built,
        before any model loads: the MCP servers are started once, the OpenEnv server served once.

        Raises:
            ValueError: a server that does not start or answer (with its stderr's or log's last lines).
        """
        if not hasattr(self, "_environment_kind"):
            self._environment_kind = self._built_kind()
        return self._environment_kind

    def _built_kind(self):
        if self.mcp_server:  # its servers start once here, to check them before any model loads
            from textenv.environments.mcp import McpServers
            from textenv.environments.mcp_session import McpServerError
            from textenv.environments.trl import load_functions

            reward_funcs = load_functions(self.reward_funcs, "--reward_funcs")
            try:
                return McpServers(self.mcp_server, reward_funcs=reward_funcs)
            except McpServerError as error:  # a settings error: one line, before any model loads
                raise ValueError(f"--mcp_server: {error}") from error
        if self.env_id and self.env_kind == "openenv":
            from textenv.environments.openenv import OpenEnvEnvironments

            where = ({"base_url": self.env_id} if self.env_id.startswith(("http://", "https://")) else
                     {"app": self.env_id} if ":" in self.env_id else {"env_id": self.env_id})
            environments = OpenEnvEnvironments(**where, max_sessions=self.max_sessions or self.max_concurrency)
            self._kept_server = _keep_serving(environments, self.env_id)
            return environments
        return None

    def close(self) -> None:
        """Stop what the options keep for the command (the OpenEnv server of ``--task openenv``)."""
        kept = self.__dict__.pop("_kept_server", None)
        if kept is not None:
            kept.__exit__(None, None, None)

    def verifiers_environment(self):
        """The verifiers environment `--env_id` / `--env_args` name, loaded once per process (`None` without `--env_id`)."""
        if not self.env_id or self.env_kind != "verifiers":
            return None
        return _load_verifiers_environment(self.env_id, self.env_args or "{}")

    def rows(self, split: str = "train"):
        """The episodes' rows: `--dataset`, else the verifiers environment's formatted rows (`get_dataset()`, or
        `get_eval_dataset()` with ``split="eval"``).

        Raises:
            ValueError: neither `--dataset` nor `--env_id`.
        """
        from textenv.gym import load_rows

        if self.dataset:
            return load_rows(self.dataset)
        environment = self.verifiers_environment()
        if environment is None:
            raise ValueError("the gym task needs --dataset (a .jsonl file of rows, a datasets folder or a hub dataset id) or --env_id"
                             + (" (an OpenEnv environment's rows: each row's columns go to its reset; give a file of {} lines for "
                                "an environment that takes none)." if self.env_kind == "openenv" else "."))
        from textenv.environments.verifiers_messages import is_v1_environment

        if is_v1_environment(environment):  # its taskset's tasks (choose them with the taskset's config)
            from textenv.environments.verifiers_v1 import task_rows

            return task_rows(environment)
        return load_rows(environment.get_eval_dataset() if split == "eval" else environment.get_dataset())

    def prepare(self, split: str = "train") -> list:
        """Load what these options name, before any model is: the plugins, the TRL environment class and its
        functions, the rows (`rows`); and check that `--gym_env` and `--context_manager` are registered.

        Returns:
            The rows.

        Raises:
            FileNotFoundError: a plugin, module or dataset file that is not there.
            ValueError: an env or context manager name that is not registered (the message lists those that are),
                or a dataset or environment that cannot be loaded (the message names the option).
        """
        from textenv.gym import load_plugins
        from textenv.gym.registry import resolve_context_manager, resolve_env

        load_plugins(self.external_plugins)
        for option, name, resolve in (("--gym_env", self.gym_env, resolve_env), ("--context_manager", self.context_manager, resolve_context_manager)):
            try:
                if name:
                    resolve(None, name)
            except ValueError as error:
                raise ValueError(f"{option} {name}: {error}; register it in a plugin file given with --external_plugins FILE.") from error
        self.trl_arguments()
        self.environment_kind()
        return self.rows(split)

    def trl_arguments(self) -> dict[str, Any]:
        """`GymScheduler`'s `environment_factory`, `tools` and `reward_funcs`, loaded from their options once (empty
        without `--environment_factory`)."""
        if not self.environment_factory:
            return {}
        if not hasattr(self, "_trl_arguments"):
            from textenv.environments.trl import load_environment_factory, load_functions

            self._trl_arguments = {
                "environment_factory": load_environment_factory(self.environment_factory),
                "tools": load_functions(self.tools, "--tools"),
                "reward_funcs": load_functions(self.reward_funcs, "--reward_funcs"),
            }
        return self._trl_arguments

    def scheduler(self, model, tokenizer, episode: EpisodeArguments):
        """The `GymScheduler` these options and `episode`'s describe (`max_turns` 0: no limit)."""
        from textenv.gym import GymScheduler
        from textenv.options import log_generation_path

        scheduler = GymScheduler(
            model,
            tokenizer,
            gym_env=self.gym_env,
            context_manager=self.context_manager,
            max_turns=self._max_turns(episode),
            loss_scale=self.loss_scale,
            generation_kwargs=episode.generation_kwargs(),
            batch_size=episode.generation_batch_size,
            max_concurrency=self.max_concurrency,
            step_timeout=self.step_timeout,
            max_length=self.max_length,
            external_plugins=self.external_plugins,
            tool_parser=episode.tool_parser,
            chat_template=episode.chat_template_text,
            fit_tool_calls=not episode.max_new_tokens_given,
            **self.trl_arguments(),
            **({"verifiers_env": self.verifiers_environment()} if self.env_id and self.env_kind == "verifiers" else {}),
            **({"environments": kind} if (kind := self.environment_kind()) is not None else {}),
            **episode.engine_options(model),
        )
        if self.environment_factory or self.tools or episode.tool_format == "json":
            scheduler.chat_tools()  # the model's certificate (textenv check-model): a model that cannot work stops here
        log_generation_path(scheduler)
        return scheduler


def _keep_serving(environments, env_id: str):
    """Start the OpenEnv environment's server now and keep it for the whole command (`kept_running`, returned:
    `GymArguments.close` stops it, else the exit does; the server stops itself if this process dies), so that a server that does not start or answer stops
    the command before any model loads, and a training run's steps do not each start one.

    Raises:
        ValueError: the server exited or did not answer in time (its log's last lines), or nothing answers at the URL.
    """
    import atexit

    import httpx

    from textenv.asyncio_bridge import run_sync
    from textenv.environments.openenv_protocol import read_actions
    from textenv.environments.openenv_server import ServerStartError

    kept = environments.kept_running()
    try:
        url = kept.__enter__()
    except ServerStartError as error:
        raise ValueError(f"--env_id {env_id}: {error}") from error
    atexit.register(kept.__exit__, None, None, None)
    try:
        run_sync(read_actions(url, environments.action_field))  # an app whose actions the replies cannot fill fails here
    except httpx.HTTPError as error:
        kept.__exit__(None, None, None)
        raise ValueError(f"--env_id {env_id}: the OpenEnv server did not answer ({type(error).__name__}: {error or 'no answer'}).") from error
    return kept


def _env_args(text: str) -> dict[str, Any]:
    """`--env_args` as a dict.

    Raises:
        ValueError: not a JSON object (the message quotes it).
    """
    import json

    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--env_args {text!r} is not JSON ({error}); give an object, e.g. '{{\"max_turns\": 4}}'.") from error
    if not isinstance(parsed, dict):
        raise ValueError(f"--env_args {text!r} is a JSON {type(parsed).__name__}; give an object of load_environment's arguments.")
    return parsed


@functools.lru_cache(maxsize=None)
def _load_verifiers_environment(env_id: str, env_args: str):
    """Loaded once per process: the rows and the scheduler of a run share one environment."""
    from textenv.environments.verifiers_messages import V1_RELEASE, installed_verifiers

    if installed_verifiers().startswith(V1_RELEASE):  # verifiers 0.4 has only the v1 API
        from textenv.environments.verifiers_v1 import load_v1_environment

        return load_v1_environment(env_id, _env_args(env_args))
    from textenv.environments.verifiers import load_verifiers_environment

    return load_verifiers_environment(env_id, _env_args(env_args))
