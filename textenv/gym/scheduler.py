"""`GymScheduler`: the Gym front end. It turns dataset rows into `GymPlay` episodes, plays them with the
one episode driver on the shared generation engine (continuous batching, each episode's KV kept across its
turns), and returns them as `GymEpisode`s, each also written to `completions.jsonl` as it ends.

An env that raises, hangs past `step_timeout` or returns a malformed value ends only its own episode; the
error is recorded in the episode and in `completions.jsonl`. `close()` always runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import torch

from textenv.asyncio_bridge import run_sync
from textenv.chat.renderer import ChatRenderer
from textenv.chat.tool_chat import ChatTools
from textenv.chat.transcript import check_loss_scale
from textenv.checks import check_positive_int
from textenv.engine.backends import DEFAULT_GENERATION_BATCH_SIZE, build_engine
from textenv.engine.engine import Completion
from textenv.engine.fast_path import DecodingPath
from textenv.engine.precision import autocast_dtype
from textenv.engine.sampling import end_token_ids
from textenv.environments.choice import chosen_kind
from textenv.environments.kind import EnvironmentKind
from textenv.episodes.driver import EnvTimeoutError, Timeouts, play_all
from textenv.gym.batching import BatchedGenerator
from textenv.gym.completions import CompletionsLog
from textenv.gym.episode import GymEpisode
from textenv.gym.play import GymPlay, completion_record
from textenv.gym.registry import load_plugins
from textenv.gym.rows import load_rows

__all__ = ["EnvTimeoutError", "GymScheduler", "KindStats", "RunStats", "completion_record"]

Policy = Callable[[List[torch.Tensor], Sequence[str]], List[Completion]]


@dataclass
class RunStats:
    """Counters of the last `run`: envs created and closed, episodes finished (also per environment kind:
    `kinds`), generation batches (with a `policy` or an overridden `generate`; `None` on the engine, which
    batches continuously)."""

    envs_created: int = 0
    envs_closed: int = 0
    episodes: int = 0
    errors: int = 0
    batch_sizes: Optional[List[int]] = None
    tool_calls: int = 0
    tool_errors: int = 0
    tool_calls_cut: int = 0
    kinds: Dict[str, "KindStats"] = field(default_factory=dict)

    def count_episode(self, episode: GymEpisode) -> None:
        """Count a finished episode, in total and under its environment kind (`kinds`)."""
        self.episodes += 1
        self.errors += bool(episode.errors)
        counts = self.kinds.setdefault(str(episode.env_kind), KindStats())
        counts.episodes += 1
        counts.errors += bool(episode.errors)
        counts.total_reward += episode.total_reward

    def count_tool_calls(self, step_info: Dict[str, Any]) -> None:
        """Add a step's JSON tool calls (`info["tool_calls"]`, a list of records) and its errors."""
        calls = step_info.get("tool_calls")
        if isinstance(calls, list):
            self.tool_calls += len(calls)
            self.tool_errors += sum(1 for call in calls if isinstance(call, dict) and call.get("error"))


@dataclass
class KindStats:
    """One environment kind's episodes in the last `run`: how many, how many with errors, their summed reward."""

    episodes: int = 0
    errors: int = 0
    total_reward: float = 0.0

    @property
    def mean_reward(self) -> float:
        return self.total_reward / self.episodes if self.episodes else 0.0


class GymScheduler:
    """Runs multi-turn episodes of registered `Env`s and returns them ready for `PPOTrainer.step`.

    Args:
        model: the policy model (a causal LM or a value-head wrapper); not needed with `policy`.
        tokenizer: its tokenizer, with a chat template.
        gym_env (`str`, *optional*): env name for rows whose `env_config` has no `name`.
        context_manager (`str`, *optional*): context manager name for rows whose `ctx_config` has no
            `name`; defaults to `"dummyContextManager"`.
        max_turns (`int`, *optional*): most model turns per episode; `None` or 0 for no limit.
        loss_scale (`str`, defaults to `"last_round"`): `"last_round"` trains the final reply only
            (ms-swift's server-mode default); `"default"` or `"all"` train every reply generated in the
            context it is trained in. Observations and template tokens are never trained.
        generation_kwargs (`dict`, *optional*): for `model.generate` (`max_new_tokens`, `do_sample`, ...).
        batch_size (`int`, defaults to 32): most episodes generated together.
        max_concurrency (`int`, defaults to 64): most episodes alive at once.
        step_timeout (`float`, *optional*, defaults to 60): seconds each `reset`, `step` and `close` may
            take; `None` for no limit.
        max_length (`int`, *optional*): an episode whose context reaches this many tokens ends
            (`finish_reason="max_length"`) instead of generating.
        stop_strings (`tuple[str]`): strings that end every model turn (an env adds its own
            `stop_strings`).
        policy (`Callable`, *optional*): ``policy(contexts, stop_strings) -> list[Completion]`` used
            instead of the model (e.g. `ScriptedPolicy` for testing envs).
        external_plugins (`str` or `list`, *optional*): plugin files to load (see `load_plugins`).
        mixed_precision (`str`, *optional*): `"bf16"` or `"fp16"`: decode under `torch.autocast` in that dtype
            (opt-in, see [`GenerationEngine`]); `None` (default): the model's dtype.
        fit_tool_calls (`bool`, defaults to `False`): raise the per-turn budget of each episode whose env offers JSON
            tools to what its longest tool call needs (`ChatTools.turn_budget`: the call as the template writes it
            plus some text) when `generation_kwargs`' `max_new_tokens` is lower; without a `max_new_tokens` there,
            those episodes get that budget anyway. `textenv rollout` and `textenv train` set it unless
            `--max_new_tokens` is given. A turn cut by the budget inside a tool call is counted
            (`stats.tool_calls_cut`, the episode's `tool_calls_cut`) and reported once, with the fix.
        tool_parser (`str` or `Callable`, *optional*): for envs with `tool_schemas` (JSON tool calls), the
            call format: `"hermes"`, `"qwen"`, `"llama3"`, `"mistral"` or a parser; default: the template's.
        chat_template (`str`, *optional*): for those envs, a template instead of the tokenizer's (default:
            the tokenizer's if it takes `tools=`, else textenv's tool-aware ChatML).
        engine (`str`, defaults to `"textenv"`): `"textenv"` (the in-process engine), `"transformers"`
            (transformers' continuous batching, with its log-probabilities), `"vllm"` (vLLM servers, the same
            episodes with exact tokens and the servers' log-probabilities), `"auto"` (by device,
            `textenv.engine.backends.auto_engine`) or an engine object;
            `vllm_server_url`, `vllm_mode` and `vllm_kwargs` configure vLLM (see `textenv.engine.backends`).
        environment_factory (`Callable` or `dict[str, Callable]`, *optional*): TRL 1.x environments, as
            `trl.GRPOTrainer` takes them: a class (or callable) building one environment, or a dict mapping names
            to such callables (each row's `environment` field picks one). Every row then plays one fresh
            instance through `TrlEnvironment`; the rows' `env_config` names no env (and `gym_env` must be
            `None`). One probe instance per factory is built here to check it, then dropped.
        tools (`list[Callable]`, *optional*): with `environment_factory`, standalone tool functions offered in
            every episode besides the environment's methods.
        reward_funcs (`Callable` or `list[Callable]`, *optional*): with `environment_factory`, TRL-style
            reward functions ``f(prompts, completions, **kwargs) -> list[float]``, summed into each episode's
            final reward (with `get_reward`, if the environment defines it).
        verifiers_env (*optional*): a classic verifiers environment (``vf.load_environment(ID, **args)``,
            verifiers 0.3, `textenv[verifiers]`). Each row (from its `get_dataset()` / `get_eval_dataset()`) is
            played by verifiers' own rollout code with the model's turns from this scheduler's engine, and
            each row's episodes are scored together by its rubric (`score_group`): the episode's
            `final_reward` is verifiers' reward, its last trajectory info holds the metrics. The
            environment's own `max_turns` and stop conditions end episodes, so `max_turns` must be `None`.
            See `textenv.environments.verifiers`.
        environments (`EnvironmentKind` or `dict[str, EnvironmentKind]`, *optional*): any environment kind
            (`textenv.environments.EnvironmentKind`: OpenEnv servers, MCP tool servers, or the kinds above built
            directly), or several by name, each row's `env_kind` column naming the one that plays it (per-kind
            counts in `stats.kinds`). Give one of `environments`, `gym_env`, `environment_factory` and
            `verifiers_env`; with none, rows name registered Gym envs in their `env_config`.

    Attributes:
        environments (`EnvironmentKind`): the kind this scheduler plays.
        stats (`RunStats`): counters of the last run.
    """

    def __init__(
        self,
        model=None,
        tokenizer=None,
        *,
        gym_env: Optional[str] = None,
        context_manager: Optional[str] = None,
        max_turns: Optional[int] = None,
        loss_scale: str = "last_round",
        generation_kwargs: Optional[dict] = None,
        batch_size: int = DEFAULT_GENERATION_BATCH_SIZE,
        max_concurrency: int = 64,
        step_timeout: Optional[float] = 60.0,
        max_length: Optional[int] = None,
        stop_strings: Sequence[str] = (),
        policy: Optional[Policy] = None,
        external_plugins: Union[str, Path, Sequence[Union[str, Path]], None] = None,
        mixed_precision: Optional[str] = None,
        tool_parser: Union[str, Callable, None] = None,
        chat_template: Optional[str] = None,
        engine: Any = "textenv",
        vllm_server_url: Union[str, Sequence[str], None] = None,
        vllm_mode: str = "server",
        vllm_kwargs: Optional[dict] = None,
        environment_factory: Union[Callable[[], Any], Mapping[str, Callable[[], Any]], None] = None,
        tools: Optional[Sequence[Callable]] = None,
        reward_funcs: Union[Callable, Sequence[Callable], None] = None,
        fit_tool_calls: bool = False,
        verifiers_env: Any = None,
        environments: Union[EnvironmentKind, Mapping[str, EnvironmentKind], None] = None,
    ):
        if tokenizer is None:
            raise ValueError("GymScheduler needs the tokenizer (its chat template renders the conversation).")
        if model is None and policy is None:
            raise ValueError("GymScheduler needs a model (or a policy callable for scripted episodes).")
        check_positive_int("batch_size", batch_size)
        check_positive_int("max_concurrency", max_concurrency)
        self.model = model
        self.tokenizer = tokenizer
        self.gym_env = gym_env
        self.context_manager = context_manager
        self.max_turns = max_turns or None
        self.loss_scale = check_loss_scale(loss_scale)
        self.generation_kwargs = generation_kwargs if generation_kwargs is not None else {}
        self.fit_tool_calls = fit_tool_calls
        self.warned_cut_tool_call = False
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency
        self.step_timeout = step_timeout
        self.max_length = max_length
        self.stop_strings = tuple(stop_strings)
        self.policy = policy
        self.mixed_precision = mixed_precision
        autocast_dtype(mixed_precision)  # a bad value fails here, not at the first turn
        self.renderer = ChatRenderer(tokenizer)
        self.tool_parser = tool_parser
        self.chat_template = chat_template
        self._chat_tools: Optional[ChatTools] = None
        self.stats = RunStats()
        self._engine: Any = None
        self._engine_choice = dict(engine=engine, vllm_server_url=vllm_server_url, vllm_mode=vllm_mode, vllm_kwargs=vllm_kwargs)
        load_plugins(external_plugins)
        self.environments = chosen_kind(environments=environments, gym_env=gym_env, environment_factory=environment_factory, tools=tools,
                                        reward_funcs=reward_funcs, verifiers_env=verifiers_env, max_turns=self.max_turns, model=model,
                                        generation_kwargs=self.generation_kwargs)

    def chat_tools(self) -> ChatTools:
        """The template and parser for envs with JSON tool calls (set up, and checked, at the first use)."""
        if self._chat_tools is None:
            ends = end_token_ids(self.model, self.generation_kwargs)
            self._chat_tools = ChatTools(self.tokenizer, self.chat_template, self.tool_parser, stop_token_ids=ends)
        return self._chat_tools

    # ------------------------------------------------------------------ generation
    def generate(self, contexts: List[torch.Tensor], stop_strings: Sequence[str] = ()) -> List[Completion]:
        """One model turn per context, for a whole batch: the `policy` if given, else the engine.
        Overriding it swaps the generator (episodes then generate in batches through it)."""
        if self.policy is not None:
            return self.policy(contexts, stop_strings)
        return self._engine_for_call().generate_batch(contexts, stop_strings=stop_strings, batch_size=self.batch_size)

    def _engine_for_call(self):
        if self._engine is None:
            self._engine = build_engine(
                model=self.model, tokenizer=self.tokenizer, batch_size=self.batch_size, mixed_precision=self.mixed_precision,
                generation_kwargs=self.generation_kwargs, **self._engine_choice,
            )
        self._engine.model = self.model
        self._engine.generation_kwargs = self.generation_kwargs
        self._engine.batch_size = self.batch_size
        return self._engine

    @property
    def engine(self):
        """The engine serving this front end's turns (a `GenerationEngine`, or a `VLLMEngine` with `engine="vllm"`)."""
        return self._engine_for_call()

    @property
    def decoding_path(self) -> DecodingPath:
        """How the engine decodes the current model's turns: its own loop, or transformers' `generate` with
        the reason (`GenerationEngine.decoding_path`). A `policy` or an overridden `generate` bypasses it."""
        return self._engine_for_call().decoding_path

    def _generator(self):
        """The engine (continuous batching), or batches through `generate` when a `policy` is given or
        `generate` is overridden."""
        if self._on_engine():
            return self._engine_for_call()
        return BatchedGenerator(self.generate, self.batch_size)

    def _on_engine(self) -> bool:
        return self.policy is None and type(self).generate is GymScheduler.generate and "generate" not in vars(self)

    # ------------------------------------------------------------------ running
    def run(
        self,
        rows: Iterable[Mapping[str, Any]],
        *,
        step: int = 0,
        num_generations: int = 1,
        completions_path: Union[str, Path, CompletionsLog, None] = None,
        progress: bool = False,
        keep_episodes: bool = True,
    ) -> List[GymEpisode]:
        """Run one episode per row (`num_generations` per row) and return them in row order.

        Works inside a running event loop too (a notebook): the episodes then run in a helper thread.
        See `arun` for the arguments.
        """
        engine = self._engine_for_call() if self._on_engine() else None  # built (and its settings checked) first
        coroutine = self.arun(
            rows, step=step, num_generations=num_generations, completions_path=completions_path,
            progress=progress, keep_episodes=keep_episodes,
        )
        if engine is not None:  # decode in this thread, play the episodes in a helper thread
            return engine.run_hosted(coroutine)
        return run_sync(coroutine)

    async def arun(
        self,
        rows: Iterable[Mapping[str, Any]],
        *,
        step: int = 0,
        num_generations: int = 1,
        completions_path: Union[str, Path, CompletionsLog, None] = None,
        progress: bool = False,
        keep_episodes: bool = True,
    ) -> List[GymEpisode]:
        """Run the episodes of `rows` concurrently.

        Args:
            rows: dataset rows (dicts, read lazily: at most `max_concurrency` episodes are alive at once),
                a `datasets.Dataset`, or the path of a `.jsonl` file.
            step (`int`): the training step, written to `completions.jsonl`.
            num_generations (`int`): episodes per row (each with its own env and trajectory id).
            completions_path: a `completions.jsonl` path (appended to) or an open `CompletionsLog`.
            progress (`bool`): show a tqdm progress bar.
            keep_episodes (`bool`): return the episodes; `False` returns `[]` and keeps memory flat over
                long runs (the log still gets every episode).

        Returns:
            The episodes, ordered by row then generation.
        """
        from tqdm import tqdm

        check_positive_int("num_generations", num_generations)
        self.environments.check(self.max_concurrency, num_generations)
        if isinstance(rows, (str, Path)):
            rows = load_rows(rows)
        self.stats = RunStats()
        log, own_log = _open_log(completions_path)
        generator = self._generator()
        timeouts = Timeouts()
        total = len(rows) * num_generations if hasattr(rows, "__len__") else None
        bar = tqdm(total=total, desc="gym episodes", unit="episode", disable=not progress)
        results: List[GymEpisode] = []

        def plays():
            for index, row in enumerate(rows):
                for _ in range(num_generations):
                    yield lambda index=index, row=row: GymPlay(self, index, row, step, timeouts)

        def finish(index: int, play: GymPlay) -> None:
            episode = play.finish()
            self.stats.count_episode(episode)
            if log is not None:
                log.write(completion_record(episode))
            bar.update(1)
            if keep_episodes:
                results.append((index, episode))

        kinds = self.environments
        scoring = kinds.group_scoring(num_generations, finish, self.step_timeout)  # classic verifiers scores a row's episodes together
        try:
            async with kinds.serving():
                await play_all(plays(), generator, self.max_concurrency, scoring.add if scoring is not None else finish)
                if scoring is not None:
                    await scoring.wait()
        finally:
            if scoring is not None:
                for task in list(scoring.tasks):
                    task.cancel()
            await timeouts.cancel_abandoned()
            bar.close()
            if own_log and log is not None:
                log.close()
            if isinstance(generator, BatchedGenerator):
                self.stats.batch_sizes = list(generator.batch_sizes)
        return [episode for _, episode in sorted(results, key=lambda pair: pair[0])]


def _open_log(target) -> tuple[Optional[CompletionsLog], bool]:
    if target is None:
        return None, False
    if isinstance(target, CompletionsLog):
        return target, False
    return CompletionsLog(target), True
