"""The tokens a model turn needs to call a tool, as the chat template writes the call."""

from __future__ import annotations

from textenv.chat.renderer import ChatRenderer, Message

JSON_TURN_BUDGET = 48  # textenv.options.DEFAULT_MAX_NEW_TOKENS["json"]: a calculator call is about 34 tokens
TEXT_BEFORE_CALL = 24
PLACEHOLDER_CHARS = 24


def call_budget(renderer: ChatRenderer, schemas: list[dict]) -> int:
    """Tokens a model turn needs to call any of `schemas`' tools: the longest call as `renderer`'s template writes
    it, each argument a `PLACEHOLDER_CHARS`-character string, plus `TEXT_BEFORE_CALL` tokens of text before it; at
    least `JSON_TURN_BUDGET`."""
    question = [{"role": "user", "content": "?"}]
    asked = len(renderer.encode(renderer.render(question, add_generation_prompt=True)))
    longest = max((len(renderer.encode(renderer.render([*question, placeholder_call(schema)]))) - asked for schema in schemas), default=0)
    return max(JSON_TURN_BUDGET, longest + TEXT_BEFORE_CALL)


def placeholder_call(schema: dict) -> Message:
    """An assistant message calling `schema`'s function with every parameter set to a placeholder string."""
    function = schema.get("function", schema)
    parameters = (function.get("parameters") or {}).get("properties") or {}
    arguments = {name: "x" * PLACEHOLDER_CHARS for name in parameters}
    # Mistral's templates want a 9-character alphanumeric call id.
    call = {"id": "call00001", "type": "function", "function": {"name": function.get("name", "tool"), "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}
