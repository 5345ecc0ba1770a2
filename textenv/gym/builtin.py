"""Built-in envs and context managers: `math_env`, `tool_env`, `dummyContextManager`, `sliding_window`."""

from __future__ import annotations

import asyncio
import re
from fractions import Fraction
from typing import Any, Dict, Optional, Tuple

from textenv.environment.syntax import CALL_TOKEN, REQUEST_TOKEN, SUBMIT_TOKEN
from textenv.gym.env import ContextManager, Env, Messages, RolloutInferRequest
from textenv.tools.json_calls import JsonToolCalls, check_tool_format
from textenv.tools.tag_calls import TagToolCalls

MATH_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
    "</answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer here "
    "</answer>"
)
MATH_RETRY_PROMPT = "The answer is not correct, It seems You made a mistake, you need to recheck very carefully."

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def extract_answer(text: str) -> Optional[str]:
    """The answer in a reply: the last ``<answer>...</answer>``, else the last ``\\boxed{...}``, else the
    last number; `None` when there is none."""
    for pattern in (_ANSWER_TAG, _BOXED, _NUMBER):
        found = pattern.findall(text or "")
        if found:
            return found[-1].strip()
    return None


def answers_match(answer: Optional[str], solution: Any) -> bool:
    """Whether `answer` equals `solution`: as exact numbers (``"0.5" == "1/2"``) when both parse, else
    as text ignoring case, spaces and a trailing period."""
    if answer is None or solution is None:
        return False
    expected = extract_answer(str(solution)) if _ANSWER_TAG.search(str(solution)) else str(solution)
    left, right = _as_number(answer), _as_number(expected)
    if left is not None and right is not None:
        return left == right
    return _normalise(answer) == _normalise(expected)


def _as_number(text: str) -> Optional[Fraction]:
    try:
        return Fraction(text.strip().replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def _normalise(text: str) -> str:
    return re.sub(r"\s+", "", str(text)).rstrip(".").lower()


class SimpleMathEnv(Env):
    """ms-swift's `math_env`: the row's `problem` is asked, the reply's answer is checked against the
    row's `solution`.

    A correct answer ends the episode with reward 1.0 (`info["stop_reason"] = "Correct"`); a wrong one
    gives reward 0.0 and the retry prompt as the next observation. (ms-swift's per-step Qwen tokenizer
    reload for a length check is dropped: the scheduler's `max_length` bounds the conversation.)

    `env_config` keys: `system_prompt` (overrides the R1-style prompt), `retry_prompt`.
    """

    async def reset(self, config: RolloutInferRequest) -> Tuple[str, Dict[str, Any], Optional[str]]:
        data = config.data_dict
        if "problem" not in data:
            raise KeyError("math_env needs a 'problem' column in the dataset row")
        self.solution = data.get("solution")
        system = self.env_config.get("system_prompt", MATH_SYSTEM_PROMPT)
        return str(data["problem"]), {}, system

    async def step(self, action: Messages) -> Tuple[Optional[str], float, bool, Dict[str, Any]]:
        correct = answers_match(extract_answer(action[-1]["content"]), self.solution)
        reward = 1.0 if correct else 0.0
        info: Dict[str, Any] = {"math_reward": reward}
        if correct:
            info["stop_reason"] = "Correct"
        return self.env_config.get("retry_prompt", MATH_RETRY_PROMPT), reward, correct, info

    async def close(self) -> None:
        return None


class ToolEnv(Env):
    """Tool use in chat form with textenv's tool syntax and tools.

    The model calls a tool with ``<request><Calculator>2+3<call>`` (the turn stops at ``<call>``); the
    tool's response comes back as the next user message. A reply without a tool call (or with
    ``<submit>``) ends the episode: reward 1.0 if its answer matches the row's `answer` (or `solution`),
    else 0.0. The tool-call rules are TextEnvironment's (`TagToolCalls`).

    With ``tool_format: "json"`` the tools are described through the chat template (`tool_schemas`),
    the model calls them as the template's JSON tool calls (several per turn allowed), the results come
    back as `tool` messages, and a reply without a call ends the episode; each step's info records the
    calls (name, arguments, result, error).

    `env_config` keys: `tools` (names from `available_tools`, default all), `tool_timeout` (seconds,
    default 10), `system_prompt`, `tool_format` (`"tags"`, default, or `"json"`). Subclass and extend
    `available_tools` to offer more tools.
    """

    stop_strings = (CALL_TOKEN,)
    available_tools: Dict[str, Any] = {}

    def __init__(self, env_config: Dict[str, Any]):
        super().__init__(env_config)
        names = env_config.get("tools", list(self.tool_classes()))
        classes = self.tool_classes()
        unknown = [name for name in names if name not in classes]
        if unknown:
            raise ValueError(f"tool_env: unknown tools {unknown}. Available: {sorted(classes)}")
        self.tools = {name: classes[name]() for name in names}
        self.tool_timeout = float(env_config.get("tool_timeout", 10.0))
        self.tool_format = check_tool_format(env_config.get("tool_format", "tags"))
        self.tool_calls = TagToolCalls(self.tools, timeout=self.tool_timeout)
        self.json_calls = JsonToolCalls(self.tools, timeout=self.tool_timeout)
        if self.tool_format == "json":
            self.stop_strings = ()
            self.tool_schemas = self.json_calls.schemas()

    def tool_classes(self) -> Dict[str, Any]:
        """`{name: tool class}` this env can offer (the calculator plus `available_tools`)."""
        from textenv.tools.calculator import Calculator

        return {"Calculator": Calculator, **self.available_tools}

    def system_prompt(self) -> str:
        names = ", ".join(self.tools)
        if self.tool_format == "json":
            return self.env_config.get("system_prompt", "Use the tools to answer. When you know the answer, reply with it and call no tool.")
        return self.env_config.get(
            "system_prompt",
            f"You can use these tools: {names}. Call one by writing {REQUEST_TOKEN}<ToolName>query{CALL_TOKEN}, "
            f"for example {REQUEST_TOKEN}<{next(iter(self.tools), 'Calculator')}>2+3{CALL_TOKEN}, and wait for the "
            f"result. When you know the answer, write it followed by {SUBMIT_TOKEN}.",
        )

    async def reset(self, config: RolloutInferRequest) -> Tuple[str, Dict[str, Any], Optional[str]]:
        data = config.data_dict
        query = data.get("query", data.get("problem"))
        if query is None:
            raise KeyError("tool_env needs a 'query' (or 'problem') column in the dataset row")
        self.answer = data.get("answer", data.get("solution"))
        return str(query), {"tools": list(self.tools)}, self.system_prompt()

    async def step(self, action: Messages) -> Tuple[Any, float, bool, Dict[str, Any]]:
        if self.tool_format == "json":
            return await self._json_step(action[-1])
        reply = action[-1]["content"]
        if self.tool_calls.ends_episode(reply):
            correct = answers_match(extract_answer(reply.replace(SUBMIT_TOKEN, "")), self.answer)
            return None, 1.0 if correct else 0.0, True, {"correct": correct}
        name, query = self.tool_calls.parse(reply)
        response = await asyncio.to_thread(self.tool_calls.respond, reply)
        info: Dict[str, Any] = {"tool": name, "query": query}
        if name not in self.tools:
            info["error"] = "unknown tool"
        return response, 0.0, False, info

    async def _json_step(self, reply: Dict[str, Any]) -> Tuple[Any, float, bool, Dict[str, Any]]:
        if not reply.get("tool_calls"):
            correct = answers_match(extract_answer(reply.get("content") or ""), self.answer)
            return None, 1.0 if correct else 0.0, True, {"correct": correct}
        tool_messages, records = await asyncio.to_thread(self.json_calls.answer, reply["tool_calls"])
        return tool_messages, 0.0, False, {"tool_calls": [record.as_dict() for record in records]}

    async def close(self) -> None:
        return None


class DummyContextManager(ContextManager):
    """Returns the history unchanged (ms-swift's `dummyContextManager`)."""

    def manage_context(self, history: Messages, trajectory_id: str) -> Messages:
        return history


class SlidingWindowContextManager(ContextManager):
    """Keeps the head (system message and first user message) and the last `max_rounds` rounds
    (assistant reply + observation); the rounds in between are dropped. With `summary` (default true)
    the first kept observation is prefixed with a note saying how many messages were left out.

    `ctx_config` keys: `max_rounds` (default 2), `summary` (default true).
    """

    def manage_context(self, history: Messages, trajectory_id: str) -> Messages:
        max_rounds = int(self.ctx_config.get("max_rounds", 2))
        head_length = 2 if history and history[0]["role"] == "system" else 1
        head, rest = history[:head_length], history[head_length:]
        keep = 2 * max_rounds
        if len(rest) <= keep:
            return history
        dropped, kept = rest[: len(rest) - keep], rest[len(rest) - keep :]
        if self.ctx_config.get("summary", True):
            note = f"[{len(dropped)} earlier messages omitted]\n"
            first_user = next((i for i, message in enumerate(kept) if message["role"] == "user"), None)
            if first_user is not None:
                kept[first_user] = {**kept[first_user], "content": note + kept[first_user]["content"]}
        return head + kept
