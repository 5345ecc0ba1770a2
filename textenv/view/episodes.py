"""One episode as a line of `episodes.jsonl`: what `textenv view` shows of it.

An episode record holds:

- `step`, `phase` (``"train"`` for the episodes a PPO step trained on; evaluations choose their own, e.g.
  ``"eval-before"``, ``"eval-after"``; ``"rollout"`` for `completions.jsonl` lines), `reward`;
- `finish_reason` (`None` when unknown) and `error` (`None` or text);
- `tool_calls`: ``{"name", "query"}`` (tag calls) or ``{"name", "arguments"}`` (JSON calls), with the
  `response` the model was told and `error` (`bool`);
- `segments`: ``{"kind", "text"}`` with kind ``"prompt"``, ``"model"`` or ``"tool"`` (tool responses and
  env observations), coloured by `textenv view` as `TextHistory.show_text` colours them; the reward is
  the record's `reward`, shown after them;
- `tokens`: ``{"ids", "mask", "text", "prompt_length"}`` (the exact ids, 1 on model tokens, each token as
  `tokenizer.convert_ids_to_tokens` spells it, as `show_tokens` prints it, and the number of prompt tokens
  at the start), or `None` when the episode has no tokens (a `completions.jsonl` line);
- `trajectory_id` for Gym episodes;
- `policy_versions`: per model turn, the version of the weights that sampled it (the training loop's count of
  optimizer steps; `None` where unknown), when any is known. With rollouts overlapping training
  (``max_staleness``) an episode's turns may come from several versions.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence

from textenv.environment.history import TextHistory
from textenv.environment.syntax import RESPONSE_TOKEN, SUBMIT_TOKEN, parse_tool_call
from textenv.tools.base import TOOL_ERROR_PREFIX
from textenv.tools.tag_calls import TagToolCalls

PROMPT, MODEL, TOOL = "prompt", "model", "tool"
SEGMENT_KINDS = (PROMPT, MODEL, TOOL)
# Tag-call responses that say the call failed: a tool error, an unparsable call, an unknown tool.
ERROR_RESPONSES = (TOOL_ERROR_PREFIX, "Unknown tool")
Record = Dict[str, Any]


def episode_record(episode: Any, step: int, phase: str, reward: Optional[float] = None, tokenizer=None) -> Record:
    """The `episodes.jsonl` record of an episode.

    Args:
        episode (`TextHistory`, `GymEpisode` or `dict`): a `TextEnvironment` episode, a Gym episode, or a
            `completions.jsonl` line.
        step (`int`): the training step it belongs to.
        phase (`str`): ``"train"``, ``"eval-before"``, ``"eval-after"``, ...
        reward (`float`, *optional*): its reward (default: the episode's own).
        tokenizer (*optional*): spells the tokens (`convert_ids_to_tokens`); without it `tokens.text` is empty.

    Returns:
        The record (a JSON-ready `dict`).
    """
    if isinstance(episode, TextHistory):
        record = history_record(episode, tokenizer)
    elif isinstance(episode, Mapping):
        record = completion_line_record(episode)
    else:
        record = gym_record(episode, tokenizer)
    record = {"step": int(step), "phase": phase, **record}
    versions = policy_versions(episode)
    if any(version is not None for version in versions):
        record["policy_versions"] = versions
    if reward is not None:
        record["reward"] = float(reward)
    return record


def policy_versions(episode: Any) -> List[Optional[int]]:
    """Per model turn, the version of the weights that sampled it, of any kind of episode `episode_record` takes."""
    if isinstance(episode, TextHistory):
        return episode.policy_versions
    if isinstance(episode, Mapping):
        return list(episode.get("turn_policy_versions") or [])
    return list(getattr(episode, "turn_policy_versions", []))


# ---------------------------------------------------------------------------------------- TextHistory
def history_record(history: TextHistory, tokenizer=None) -> Record:
    """Reward, finish reason, tool calls, segments and tokens of a `TextEnvironment` episode."""
    segments = history_segments(history)
    info = history.info if isinstance(history.info, dict) else {}
    json_calls = info.get("tool_calls")
    return {
        "reward": _number(history.reward),
        "finish_reason": info.get("finish_reason") or _tag_finish_reason(history),
        "error": None,
        "tool_calls": [json_call(call) for call in json_calls] if isinstance(json_calls, list) else tag_tool_calls(segments),
        "segments": segments,
        "tokens": history_tokens(history, tokenizer),
    }


def history_segments(history: TextHistory) -> List[Record]:
    """The segments as `show_text` colours them: the first is the prompt, later ones are the model's
    (model colour) or system text, i.e. tool responses (system colour)."""
    return [
        {"kind": PROMPT if index == 0 else (TOOL if system else MODEL), "text": history.text[start:end]}
        for index, ((start, end), system) in enumerate(zip(history.text_spans, history.system_spans))
    ]


def history_tokens(history: Optional[TextHistory], tokenizer=None) -> Optional[Record]:
    """``{"ids", "mask", "text", "prompt_length"}`` of a history (`None` for none)."""
    if history is None:
        return None
    ids = [int(token) for token in history.tokens.tolist()]
    text = [str(token) for token in tokenizer.convert_ids_to_tokens(ids)] if tokenizer is not None else []
    return {"ids": ids, "mask": [int(mask) for mask in history.token_masks.tolist()], "text": text, "prompt_length": history.token_spans[0][1]}


def tag_tool_calls(segments: Sequence[Mapping[str, Any]]) -> List[Record]:
    """The ``<request><Tool>query<call>`` calls of model segments, each with the tool segment after it."""
    calls = []
    for index, segment in enumerate(segments):
        if segment["kind"] != MODEL or not TagToolCalls.calls_tool(segment["text"]):
            continue
        name, query = parse_tool_call(segment["text"])
        after = segments[index + 1] if index + 1 < len(segments) else None
        response = after["text"].removesuffix(RESPONSE_TOKEN) if after is not None and after["kind"] == TOOL else None
        calls.append({"name": name or "", "query": query, "response": response, "error": _failed(response)})
    return calls


def json_call(call: Mapping[str, Any]) -> Record:
    """A JSON tool call's record (`ToolCallRecord.as_dict()`: name, arguments, result, error)."""
    return {"name": call.get("name") or "", "arguments": call.get("arguments"), "response": call.get("result"), "error": bool(call.get("error"))}


def _tag_finish_reason(history: TextHistory) -> str:
    if history.truncated:
        return "truncated"  # max_turns or max_length
    if SUBMIT_TOKEN in (history.last_model_segment or ""):
        return "submit"
    return "no_tool_call"  # the model stopped without a call (or wrote EOS)


# ---------------------------------------------------------------------------------------- Gym episodes
def gym_record(episode: Any, tokenizer=None) -> Record:
    """A `GymEpisode`'s record: segments and tool calls from its messages and step infos, its tokens."""
    record = _messages_record(episode.messages, episode.trajectory_infos, episode.total_reward, episode.finish_reason, episode.error)
    return {**record, "tokens": history_tokens(episode.history, tokenizer), "trajectory_id": episode.trajectory_id,
            "tool_calls_cut": episode.tool_calls_cut, "env_kind": episode.env_kind}


def completion_line_record(line: Mapping[str, Any]) -> Record:
    """The record of a `completions.jsonl` line (no tokens: the line has none)."""
    record = _messages_record(line.get("messages") or [], line.get("trajectory_infos") or [], line.get("total_reward"), line.get("finish_reason"), line.get("error"))
    return {"step": int(line.get("step") or 0), "phase": "rollout", **record, "tokens": None, "trajectory_id": line.get("trajectory_id"),
            "tool_calls_cut": int(line.get("tool_calls_cut") or 0), "env_kind": line.get("env_kind")}


def _messages_record(messages: Sequence[Mapping], infos: Sequence[Any], reward: Any, finish_reason: Optional[str], error: Any) -> Record:
    return {
        "reward": _number(reward),
        "finish_reason": finish_reason,
        "error": error_text(error),
        "tool_calls": gym_tool_calls(messages, infos),
        "segments": message_segments(messages),
    }


def message_segments(messages: Sequence[Mapping[str, Any]]) -> List[Record]:
    """One segment per message: system and user messages before the first reply are the prompt, assistant
    messages the model's, tool messages and later user messages (the env's observations) tool text."""
    segments, replied = [], False
    for message in messages:
        role = message.get("role")
        replied = replied or role == "assistant"
        kind = MODEL if role == "assistant" else (TOOL if role == "tool" or replied else PROMPT)
        segments.append({"kind": kind, "text": message_text(message)})
    return segments


def message_text(message: Mapping[str, Any]) -> str:
    """A message's content (text parts joined), then its JSON tool calls, one per line."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") if isinstance(part, Mapping) else str(part) for part in content)
    calls = [call.get("function", call) for call in message.get("tool_calls") or [] if isinstance(call, Mapping)]
    lines = [json.dumps({"name": call.get("name"), "arguments": call.get("arguments")}, ensure_ascii=False) for call in calls]
    return "\n".join([str(content or ""), *lines]) if lines else str(content or "")


def gym_tool_calls(messages: Sequence[Mapping[str, Any]], infos: Sequence[Any]) -> List[Record]:
    """Tool calls from the step infos (after the reset info): JSON calls (`info["tool_calls"]`, as the
    `tool_env` writes them) and tag calls (``{"tool", "query"}``, answered by the next message)."""
    replies = [index for index, message in enumerate(messages) if message.get("role") == "assistant"]
    calls: List[Record] = []
    for turn, info in enumerate(infos[1:]):
        if not isinstance(info, Mapping):
            continue
        if isinstance(info.get("tool_calls"), list):
            calls.extend(json_call(call) for call in info["tool_calls"] if isinstance(call, Mapping))
        elif "tool" in info:
            after = replies[turn] + 1 if turn < len(replies) else len(messages)
            response = message_text(messages[after]) if after < len(messages) else None
            calls.append({"name": info.get("tool") or "", "query": info.get("query"), "response": response, "error": bool(info.get("error")) or _failed(response)})
    return calls


def error_text(error: Any) -> Optional[str]:
    """An episode error as one line: ``stage: Type: message`` for an error record, else its text."""
    if not error:
        return None
    if isinstance(error, Mapping):
        return ": ".join(str(error[key]) for key in ("stage", "type", "message") if error.get(key) is not None)
    return str(error)


def _failed(response: Optional[str]) -> bool:
    return response is None or response.startswith(ERROR_RESPONSES)


def _number(value: Any) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
