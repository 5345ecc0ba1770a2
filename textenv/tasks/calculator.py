"""The legacy calculator task: `What is a op b?` with a, b in [0, 50) and op in + - *, a 2-shot prompt
and an exact-match reward on `Result=N<submit>`.

The bundled model is an instruct (chat) model: it answers a plain-text prompt with an immediate
`<|im_end|>`, so the 2-shot examples are written in its chat format. Each query closes the user turn and
opens the assistant turn; the model then writes the tool call.
"""

from __future__ import annotations

import random
import re
from typing import Sequence

TOOL_NAME = "Calculator"

SYSTEM_MESSAGE = (
    "You answer arithmetic questions with a calculator. Call it as "
    "<request><Calculator>expression<call>, read the result after it, then answer as Result=number<submit>."
)

PROMPT = (
    f"<|im_start|>system\n{SYSTEM_MESSAGE}<|im_end|>\n"
    "<|im_start|>user\nWhat is 13-3?<|im_end|>\n"
    "<|im_start|>assistant\n<request><Calculator>13-3<call>10<response>\nResult=10<submit><|im_end|>\n"
    "<|im_start|>user\nWhat is 4*3?<|im_end|>\n"
    "<|im_start|>assistant\n<request><Calculator>4*3<call>12<response>\nResult=12<submit><|im_end|>\n"
    "<|im_start|>user\n"
)

_RESULT = re.compile(r"Result\s*=\s*(-?\d+(\.\d+)?)\s*<submit>")
OPERATORS = ("+", "-", "*")


def format_query(question: str) -> str:
    """The text that follows `PROMPT` for one question: the user turn and the opening assistant turn."""
    return f"{question}<|im_end|>\n<|im_start|>assistant\n"


def generate_tasks(count: int, seed: int | None = None, plain: bool = False) -> tuple[list[str], list[float]]:
    """`count` random questions `What is a op b?` (a, b in [0, 50), op in + - *), formatted with
    `format_query` (bare with `plain`, for chat-form episodes), and their answers."""
    rng = random.Random(seed)
    tasks = [random_task(rng, plain) for _ in range(count)]
    return [query for query, _ in tasks], [answer for _, answer in tasks]


def random_task(rng: random.Random, plain: bool = False) -> tuple[str, float]:
    """One random task drawn from `rng`: the query (formatted with `format_query`, bare with `plain`) and
    its answer."""
    a, b, operator = rng.randrange(50), rng.randrange(50), rng.choice(OPERATORS)
    question = f"What is {a}{operator}{b}?"
    return (question if plain else format_query(question)), float(_apply(a, operator, b))


def _apply(a: int, operator: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b}[operator]


def parse_result(text: str) -> float | None:
    """The number in `Result=N<submit>`, or None."""
    match = _RESULT.search(text)
    return float(match.group(1)) if match else None


def exact_match_reward(texts: Sequence[str], answers: Sequence[float]) -> list[float]:
    """1.0 where the text ends with `Result=N<submit>` and N is within 0.01 of the answer, else 0.0."""
    rewards = []
    for text, answer in zip(texts, answers):
        result = parse_result(text)
        rewards.append(1.0 if result is not None and abs(result - float(answer)) < 0.01 else 0.0)
    return rewards


# ---------------------------------------------------------------------------- JSON tool calls
JSON_SYSTEM_MESSAGE = (
    "You answer arithmetic questions with the Calculator tool. Call it, read its result, then answer as "
    "Result=number."
)


def _json_example(index: int, question: str, expression: str, result: str) -> list[dict]:
    call_id = f"call9{index:04d}"
    call = {"id": call_id, "type": "function", "function": {"name": TOOL_NAME, "arguments": {"query": expression}}}
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": result, "tool_call_id": call_id, "name": TOOL_NAME},
        {"role": "assistant", "content": f"Result={result}"},
    ]


# The same two examples as `PROMPT`, as chat messages with JSON tool calls (for `tool_format="json"`).
JSON_PROMPT = [
    {"role": "system", "content": JSON_SYSTEM_MESSAGE},
    *_json_example(1, "What is 13-3?", "13-3", "10"),
    *_json_example(2, "What is 4*3?", "4*3", "12"),
]
_JSON_RESULT = re.compile(r"^\s*Result\s*=\s*(-?\d+(\.\d+)?)\s*(<\|im_end\|>)?\s*$")


def json_exact_match_reward(texts: Sequence[str], answers: Sequence[float]) -> list[float]:
    """1.0 where the final reply is `Result=N` (nothing else) and N is within 0.01 of the answer, else 0.0."""
    rewards = []
    for text, answer in zip(texts, answers):
        match = _JSON_RESULT.match(text)
        rewards.append(1.0 if match is not None and abs(float(match.group(1)) - float(answer)) < 0.01 else 0.0)
    return rewards
