"""TextEnvironment: let a model call tools in text, episode by episode, and record what happened.

The model writes ``<request><ToolName>query<call>``; the environment runs the tool and appends
``response<response>``; the model ends the episode with ``<submit>`` (or by not calling a tool, or EOS).
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import Any, Callable, Sequence

import torch

from textenv.chat.tool_chat import ChatTools
from textenv.asyncio_bridge import run_sync
from textenv.environment.chat_tools import play_json_episodes, turns_through_generate
from textenv.environment.ending import EndingAndRewards
from textenv.environment.history import TextHistory
from textenv.environment.syntax import (
    CALL_TOKEN,
    CONTROL_TAGS,
    REQUEST_TOKEN,
    RESPONSE_TOKEN,
    SUBMIT_TOKEN,
    neutralize,
    parse_tool_call,
)
from textenv.checks import check_positive_int, check_prompt, check_queries, resolve_max_tool_response
from textenv.engine.backends import DEFAULT_GENERATION_BATCH_SIZE, build_engine
from textenv.engine.engine import model_device, unwrap_model
from textenv.engine.fast_path import DecodingPath
from textenv.engine.sampling import end_token_ids
from textenv.episodes.driver import MAX_TURNS, Episode, StopRule, play_all
from textenv.episodes.lockstep import LockstepGenerator
from textenv.logs import progress_bar
from textenv.padding import ensure_pad_token
from textenv.tools.base import tools_by_name
from textenv.tools.json_calls import check_tool_format
from textenv.tools.tag_calls import TagToolCalls

CONTINUOUS = "continuous"
LOCKSTEP = "lockstep"


class TextEnvironment(EndingAndRewards):
    """Runs tool-using episodes for a batch of queries and returns what `PPOTrainer.step` takes.

    Args:
        model: a causal LM (`AutoModelForCausalLM`) or a value-head wrapper around one.
        tokenizer: the model's tokenizer. Without a pad token, EOS is used (with a warning).
        tools (`dict` or `list`): tools by name (`{"Calculator": fn}`), or a list of tools named by their
            class name (or their `name` attribute for smolagents-style tools).
        reward_fn (`Callable`): called once per batch as `reward_fn(last_segments, **run_kwargs)` with the
            list of each episode's last text segment; returns one reward per episode.
        prompt (`str`): text put in front of every query (usually few-shot examples).
        max_turns (`int`, defaults to 4): model turns per episode; an episode still running after them
            is completed and marked truncated.
        max_tool_reponse (`int`, defaults to 100): longest tool response in characters; longer responses
            keep their first `max_tool_reponse - 3` characters followed by `"..."`. The legacy spelling;
            `max_tool_response` is accepted as well.
        max_length (`int`, *optional*): longest episode in tokens (the tokens the history really holds);
            a longer one is completed and marked truncated.
        generation_kwargs (`dict`, *optional*): passed to `generate` (`max_new_tokens`, `do_sample`, ...).
            Kept as given and never modified.
        max_tool_response (`int`, *optional*): same as `max_tool_reponse`.
        batch_size (`int`, defaults to 32): most episodes decoded together (finished episodes leave the
            batch and waiting ones take their place).
        tool_timeout (`float`, *optional*): seconds a tool may run before its response becomes
            `"Tool error: ... timed out"`.
        turn_order (`str`, *optional*): `"continuous"` plays every episode at its own pace on the
            generation engine; `"lockstep"` runs legacy TRL's order through `self.generate` (every active
            episode's turn, then every tool call), in both tool formats. `None` (default): continuous,
            unless `generate` is overridden (a subclass, or patched as legacy tests do), which then runs in
            lockstep with a warning.
        mixed_precision (`str`, *optional*): `"bf16"` (or `"fp16"`) decodes under `torch.autocast` in that
            dtype (opt-in: greedy episodes can differ from float32 ones; for GPUs, on CPU it measured slower,
            see [`GenerationEngine`]); `None` (default): the model's dtype.
        tool_format (`str`, defaults to `"tags"`): `"tags"`, the legacy `<request><Tool>query<call>` syntax;
            `"json"`, the chat template's tool calls: episodes are conversations (`prompt` is the system
            message, or a list of messages; each query is a user message), the tools' JSON schemas go to
            the template's `tools=`, the model's calls are parsed and answered as `tool` messages, and a
            turn without a call ends the episode. `history.info` records the calls.
        tool_parser (`str` or `Callable`, *optional*): with `tool_format="json"`, the call format:
            `"hermes"` (also `"qwen"`), `"llama3"`, `"mistral"` or ``parser(text) -> ParsedTurn``; default:
            the one the chat template writes.
        chat_template (`str`, *optional*): with `tool_format="json"`, a template to use instead of the
            tokenizer's (default: the tokenizer's if it takes `tools=`, else textenv's tool-aware ChatML).
        progress (`bool`, defaults to `False`): show a progress bar over the episodes of each `run`
            (continuous turn order; on the main process only).
        engine (`str`, defaults to `"textenv"`): what generates the turns: `"textenv"`, the in-process engine;
            `"transformers"`, transformers' continuous batching (`textenv.engine.transformers_cb`); `"vllm"`, vLLM
            servers (the same episodes and exact tokens; see `textenv.vllm.VLLMEngine`); `"auto"`, chosen by device
            (`textenv.engine.backends.auto_engine`); or an engine object. `vllm_server_url` (one URL, a list, or comma-separated), `vllm_mode` (`"server"`
            or `"colocate"`) and `vllm_kwargs` configure the vLLM backend (see `textenv.engine.backends`).
    """

    def __init__(
        self,
        model=None,
        tokenizer=None,
        tools: dict | list | None = None,
        reward_fn: Callable | None = None,
        prompt: str | None = None,
        max_turns: int = 4,
        max_tool_reponse: int | None = None,
        max_length: int | None = None,
        generation_kwargs: dict | None = None,
        *,
        max_tool_response: int | None = None,
        batch_size: int = DEFAULT_GENERATION_BATCH_SIZE,
        tool_timeout: float | None = None,
        turn_order: str | None = None,
        mixed_precision: str | None = None,
        tool_format: str = "tags",
        tool_parser: str | Callable | None = None,
        chat_template: str | None = None,
        progress: bool = False,
        engine: Any = "textenv",
        vllm_server_url: str | Sequence[str] | None = None,
        vllm_mode: str = "server",
        vllm_kwargs: dict | None = None,
    ):
        if model is None or tokenizer is None:
            raise ValueError("TextEnvironment needs a model and a tokenizer: TextEnvironment(model, tokenizer, tools, ...).")
        self.tool_format = check_tool_format(tool_format)
        check_prompt(prompt, tool_format)
        check_positive_int("max_turns", max_turns, allow_zero=True)
        if max_length is not None:
            check_positive_int("max_length", max_length)
        self.model = model
        self.tokenizer = tokenizer
        ensure_pad_token(tokenizer)
        self.tools = tools_by_name(tools)
        self.reward_fn = reward_fn
        self.prompt = prompt if prompt is not None else ""
        self.max_turns = max_turns
        self.max_tool_response = resolve_max_tool_response(max_tool_reponse, max_tool_response)
        self.max_length = max_length
        self.generation_kwargs = generation_kwargs if generation_kwargs is not None else {}
        self.batch_size = batch_size
        self.tool_timeout = tool_timeout
        self.progress = progress
        if turn_order not in (None, CONTINUOUS, LOCKSTEP):
            raise ValueError(f"turn_order must be None, {CONTINUOUS!r} or {LOCKSTEP!r}, got {turn_order!r}.")
        self.turn_order = turn_order
        self._warned_lockstep = False
        self.request_token = REQUEST_TOKEN
        self.call_token = CALL_TOKEN
        self.response_token = RESPONSE_TOKEN
        self.submit_token = SUBMIT_TOKEN
        self.is_encoder_decoder = bool(getattr(getattr(unwrap_model(model), "config", None), "is_encoder_decoder", False))
        if self.is_encoder_decoder:
            raise NotImplementedError("TextEnvironment supports decoder-only (causal) language models.")
        self.current_device = model_device(model)
        self._engine = build_engine(
            engine, model, tokenizer, batch_size=batch_size, mixed_precision=mixed_precision,
            vllm_server_url=vllm_server_url, vllm_mode=vllm_mode, vllm_kwargs=vllm_kwargs, generation_kwargs=self.generation_kwargs,
        )
        self._chat_tools = None
        if tool_format == "json":
            self._chat_tools = ChatTools(tokenizer, chat_template, tool_parser, stop_token_ids=end_token_ids(model, self.generation_kwargs))

    # ------------------------------------------------------------------ episodes
    def run(self, queries: Sequence[str], **rewards_kwargs) -> tuple[list, list, list, list, list[TextHistory]]:
        """Run one episode per query.

        Episodes are played by the one episode driver on the generation engine: an episode goes on to its
        next turn as soon as its tool has answered, while slower episodes are still generating (the same
        turns as legacy TRL's lockstep loop, with no waiting for the slowest row). With
        `turn_order="lockstep"` turns run in legacy order through `self.generate`: every active episode's
        turn, then every tool call.

        Args:
            queries (`list[str]`): the tasks; each episode starts from `prompt + query`.
            rewards_kwargs: passed to `reward_fn` (for example `answers=answers`).

        Returns:
            `(queries, responses, masks, rewards, histories)`, one entry per query in input order: the
            first segment's token ids, all later token ids (model and tool interleaved), their mask
            (1 = model token), the reward, and the `TextHistory`.
        """
        check_queries(queries)
        lockstep = self._turn_order() == LOCKSTEP
        if self.tool_format == "json":
            episodes = play_json_episodes(self, queries, lockstep=lockstep)
            histories = run_sync(episodes) if lockstep else self._engine_for_call().run_hosted(episodes)
        elif lockstep:
            histories = self._run_in_lockstep(self._start_histories(queries))
        else:
            histories = self._engine_for_call().run_hosted(self._play(self._start_histories(queries)))
        for history in histories:
            if not history.completed:
                history.complete(truncated=True)
        self.compute_reward(histories, **rewards_kwargs)
        split = [history.split_query_response_tokens() for history in histories]
        queries_tokens = [query for query, _, _ in split]
        responses = [response for _, response, _ in split]
        masks = [mask for _, _, mask in split]
        rewards = [history.reward for history in histories]
        return queries_tokens, responses, masks, rewards, histories

    def _turn_order(self) -> str:
        # A subclass method, an attribute set on the instance, or a patch of the class attribute
        # (`patch.object(TextEnvironment, "generate", ...)`, as legacy tests do) replaces generation, and
        # only the lockstep order calls it.
        overridden = "generate" in vars(self) or type(self).generate is not _BUILTIN_GENERATE
        if self.turn_order is not None:
            if overridden and self.turn_order == CONTINUOUS:
                raise ValueError(
                    "turn_order='continuous' plays episodes on the generation engine, which never calls the "
                    "overridden generate(); pass turn_order='lockstep' (or None) to use it."
                )
            return self.turn_order
        if overridden and not self._warned_lockstep:
            self._warned_lockstep = True
            warnings.warn(
                "TextEnvironment.generate is overridden: turns run in lockstep through it (legacy order). "
                "Pass turn_order='lockstep' to say so and silence this warning.",
                stacklevel=3,
            )
        return LOCKSTEP if overridden else CONTINUOUS

    def _run_in_lockstep(self, histories: list[TextHistory]) -> list[TextHistory]:
        """Legacy order: every active episode's turn through `self.generate`, then every tool call, repeat."""
        turns = 0
        while any(not history.completed for history in histories) and turns < self.max_turns:
            histories = self.generate(histories)
            histories = self.tasks_end_check(histories)
            for index in range(len(histories)):
                histories[index] = self.step(histories[index])
            histories = self.tasks_end_check(histories, model_turn=False)
            turns += 1
        return histories

    async def _play(self, histories: list[TextHistory]) -> list[TextHistory]:
        """The same turns per episode as the lockstep order, each episode at its own pace."""
        episodes = await self._play_episodes([_ToolEpisode(self, history) for history in histories])
        return [episode.history for episode in episodes]

    async def _play_episodes(self, episodes: list[Episode], lockstep: bool = False) -> list[Episode]:
        """Play `episodes` on the engine, or with `lockstep` round by round through `self.generate` (with
        the progress bar if asked); the first error of an episode is raised, as legacy TRL raised it."""
        generator = LockstepGenerator(partial(turns_through_generate, self), len(episodes)) if lockstep else self._engine_for_call()
        with progress_bar(len(episodes), self.progress) as bar:
            await play_all([lambda episode=episode: episode for episode in episodes], generator, len(episodes), lambda *_: bar.update())
        for episode in episodes:
            if episode.failures:
                raise episode.failures[0].error
        return episodes

    def _react(self, history: TextHistory, completion) -> TextHistory:
        """Record the model's turn, end the episode or answer its tool call."""
        history.append_segment(completion.text, completion.token_ids, system=False, logprobs=completion.logprobs,
                               policy_version=completion.policy_version)
        history = self.tasks_end_check([history])[0]
        history = self.step(history)
        return self.tasks_end_check([history], model_turn=False)[0]

    def _start_histories(self, queries: Sequence[str]) -> list[TextHistory]:
        return [self._start_history(index, query) for index, query in enumerate(queries)]

    def _start_history(self, index: int, query: str) -> TextHistory:
        text = self.prompt + query
        tokens = self.tokenizer(text, return_tensors="pt").input_ids[0].to(self.current_device)
        if self.max_length is not None and len(tokens) > self.max_length:
            raise ValueError(
                f"queries[{index}]: prompt + query is {len(tokens)} tokens, longer than max_length="
                f"{self.max_length}. Shorten the prompt or raise max_length."
            )
        return TextHistory(text, tokens, system=True)

    def step(self, history: TextHistory) -> TextHistory:
        """One environment turn: run the tool the model asked for and append its response.

        Ends the episode first if `task_end_check` says so; a completed history is returned unchanged.
        """
        truncated, ended = self.task_end_check(history)
        if ended:
            history.complete(truncated=truncated)
        if history.completed:
            return history
        tool_calls = self._tool_calls()
        response = tool_calls.truncate(neutralize(tool_calls.respond(history.last_text_segment), self._forbidden_strings()))
        text = response + self.response_token
        tokens = self.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
        history.append_segment(text, tokens.to(history.tokens.device), system=True)
        return history

    def _tool_calls(self) -> TagToolCalls:
        # Built per call: tools, limits and `parse_tool_call` may be replaced after construction.
        return TagToolCalls(self.tools, timeout=self.tool_timeout, max_response=self.max_tool_response, parse=self.parse_tool_call)

    def _forbidden_strings(self) -> list[str]:
        return [*CONTROL_TAGS, *self.tokenizer.all_special_tokens]

    def parse_tool_call(self, text: str) -> tuple[str | None, str | None]:
        """`(tool_name, query)` of the tool call in `text`, or `(None, None)`; see `textenv.parse_tool_call`."""
        return parse_tool_call(text)

    # ------------------------------------------------------------------ generation
    def generate(self, histories: list[TextHistory]) -> list[TextHistory]:
        """Generate one model turn for every history that is not completed; returns the same list."""
        active = [index for index, history in enumerate(histories) if not history.completed]
        completions = self._engine_for_call().generate_batch(
            [histories[index].tokens for index in active],
            stop_strings=self._stop_strings(),
            generation_kwargs=self.generation_kwargs,
            batch_size=self.batch_size,
        )
        for index, completion in zip(active, completions):
            histories[index].append_segment(completion.text, completion.token_ids, system=False, logprobs=completion.logprobs,
                                            policy_version=completion.policy_version)
        return histories

    def _generate_batched(self, query_tensors: Sequence[torch.Tensor], batch_size: int = 16, pad_to_multiple_of=None) -> list[torch.Tensor]:
        """Legacy helper: generate one turn per token tensor and return the new token ids only."""
        completions = self._engine_for_call().generate_batch(
            list(query_tensors),
            stop_strings=self._stop_strings(),
            generation_kwargs=self.generation_kwargs,
            batch_size=batch_size,
        )
        return [completion.token_ids for completion in completions]

    def _stop_strings(self) -> tuple[str, ...]:
        # A JSON turn ends at EOS (the template's end of turn); the tags end one at <call> or <submit>.
        return () if self.tool_format == "json" else (self.call_token, self.submit_token)

    def _engine_for_call(self):
        # Attributes may be replaced after construction (env.model = ...); the engine follows them.
        self._engine.model = self.model
        self._engine.tokenizer = self.tokenizer
        self._engine.batch_size = self.batch_size
        return self._engine

    @property
    def engine(self):
        """The engine serving this front end's turns (a `GenerationEngine`, or a `VLLMEngine` with `engine="vllm"`)."""
        return self._engine_for_call()

    @property
    def decoding_path(self) -> DecodingPath:
        """How the engine decodes the current model's turns: its own loop, or transformers' `generate` with
        the reason (`GenerationEngine.decoding_path`). Turns through an overridden `generate` bypass it."""
        return self._engine_for_call().decoding_path


_BUILTIN_GENERATE = TextEnvironment.generate


class _ToolEpisode(Episode):
    """A TextEnvironment episode for the driver: the context is the history's tokens, and the reaction is
    the environment's own (`step` and the end checks, which subclasses may override)."""

    stop_rules = (StopRule("completed", lambda episode: episode.history.completed), MAX_TURNS)

    def __init__(self, env: TextEnvironment, history: TextHistory):
        super().__init__()
        self.env = env
        self.history = history
        self.max_turns = env.max_turns
        self.stop_strings = (env.call_token, env.submit_token)
        self.generation_kwargs = env.generation_kwargs

    def context(self) -> torch.Tensor:
        return self.history.tokens

    async def react(self, completion) -> None:
        self.history = self.env._react(self.history, completion)
