"""`TextEnvironment(tool_format="json")`: episodes as chat conversations with the template's JSON tool calls.

Each episode opens with the prompt (a system message, or a list of messages such as few-shot turns) and
the query as a user message, rendered by the chat template with the tools' schemas. The model's turn is
kept as its exact sampled ids; its tool calls are parsed and run, and the results plus the next
assistant header are appended as the template's delta. A turn without a tool call ends the episode.
"""

from __future__ import annotations

from typing import Optional

import torch

from textenv.chat.renderer import Messages
from textenv.chat.tool_chat import ChatTools
from textenv.chat.transcript import Transcript
from textenv.engine.engine import FINISH_EOS, FINISH_LENGTH, Completion
from textenv.environment.history import TextHistory
from textenv.episodes.driver import FINISH_MAX_LENGTH, FINISH_MAX_TURNS, MAX_TURNS, Episode, StopRule
from textenv.tools.json_calls import OBSERVATION_CONTROL_STRINGS, JsonToolCalls, ToolCallRecord


class ChatToolEpisode(Episode):
    """One `TextEnvironment` episode in JSON tool-call form, as the driver plays it."""

    stop_rules = (StopRule("answered", lambda episode: episode.answered), MAX_TURNS)

    def __init__(self, transcript: Transcript, calls: JsonToolCalls, neutralize, max_turns: int, max_length: Optional[int], generation_kwargs: dict):
        super().__init__()
        self.transcript = transcript
        self.calls = calls
        self.neutralize = neutralize
        self.max_turns = max_turns
        self.max_length = None if max_length is None else max_length + 1  # legacy: longer than max_length ends it
        self.generation_kwargs = generation_kwargs
        self.answered = False
        self.records: list[ToolCallRecord] = []
        self._prompt = None

    def context(self) -> torch.Tensor:
        ids, self._prompt = self.transcript.generation_context()
        return ids

    async def react(self, completion) -> None:
        message = self.transcript.add_reply(completion, self._prompt)
        if not message.get("tool_calls"):
            self.answered = True
            return
        tool_messages, records = self.calls.answer(message["tool_calls"], self.neutralize)
        self.records.extend(records)
        self.transcript.add_messages(tool_messages)

    def history(self) -> TextHistory:
        """The episode as a `TextHistory` (every model turn trained), completed; `info` holds the calls."""
        history = self.transcript.to_history("all", keep_trailing=True)
        if history is None:  # no model turn: the opening alone
            segments = [segment for entry in self.transcript.entries for segment in entry.segments]
            history = TextHistory("".join(segment.text for segment in segments), torch.cat([segment.tokens for segment in segments]))
        history.info = {
            "messages": self.transcript.messages,
            "tool_calls": [record.as_dict() for record in self.records],
            "tool_errors": sum(record.error is not None for record in self.records),
            "finish_reason": self.finish_reason,
        }
        history.complete(truncated=self.finish_reason in (FINISH_MAX_TURNS, FINISH_MAX_LENGTH))
        return history


async def play_json_episodes(env, queries, lockstep: bool = False) -> list[TextHistory]:
    """Play one JSON tool-call episode per query of a `TextEnvironment`: on its engine, or with `lockstep`
    in legacy order through its `generate` (see `turns_through_generate`); the first error of an episode
    is raised (as in the tag format)."""
    chat: ChatTools = env._chat_tools
    calls = JsonToolCalls(env.tools, timeout=env.tool_timeout, max_response=env.max_tool_response)
    renderer, parse = chat.renderer_for(calls.schemas()), chat.parser_for(calls.schemas())
    episodes = []
    for index, query in enumerate(queries):
        transcript = Transcript(renderer, opening_messages(env.prompt, query), tool_parser=parse)
        if env.max_length is not None and transcript.num_tokens > env.max_length:
            raise ValueError(
                f"queries[{index}]: the rendered prompt and query are {transcript.num_tokens} tokens, longer than "
                f"max_length={env.max_length}. Shorten the prompt or raise max_length."
            )
        neutralize = lambda text: renderer.neutralize(text, OBSERVATION_CONTROL_STRINGS)  # noqa: E731
        episodes.append(ChatToolEpisode(transcript, calls, neutralize, env.max_turns, env.max_length, env.generation_kwargs))
    return [episode.history() for episode in await env._play_episodes(episodes, lockstep=lockstep)]


def turns_through_generate(env, contexts) -> list[Completion]:
    """One model turn per context from `env.generate`, the tag format's contract: it is given a
    `TextHistory` per episode (here the conversation and the assistant's generation prompt) and appends
    the model's segment to each. A segment ending in the EOS token ends the turn as an EOS would."""
    histories = [TextHistory(env.tokenizer.decode(context, skip_special_tokens=False), context.to(env.current_device)) for context in contexts]
    histories = env.generate(histories)
    return [_appended_turn(history, len(context), env.tokenizer.eos_token_id) for history, context in zip(histories, contexts)]


def _appended_turn(history: TextHistory, context_length: int, eos_token_id) -> Completion:
    token_ids = history.tokens[context_length:]
    text = history.text[history.text_spans[1][0] :] if len(history.text_spans) > 1 else ""
    ended_by_eos = len(token_ids) > 0 and eos_token_id is not None and int(token_ids[-1]) == eos_token_id
    logprobs = history.token_logprobs[context_length:]
    logprobs = None if bool(logprobs.isnan().all()) else logprobs  # the engine reported none
    reason = FINISH_EOS if ended_by_eos else FINISH_LENGTH
    return Completion(token_ids, text, reason, logprobs=logprobs, policy_version=history.segment_policy_versions[-1])


def opening_messages(prompt, query: str) -> Messages:
    """The first messages of an episode: the prompt (a system message, or messages) and the query."""
    if isinstance(prompt, (list, tuple)):
        head = [dict(message) for message in prompt]
    else:
        head = [{"role": "system", "content": prompt}] if prompt else []
    return [*head, {"role": "user", "content": query}]
