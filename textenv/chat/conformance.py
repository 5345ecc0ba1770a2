"""Does a chat template render a conversation append-only? Checked turn by turn, token by token.

A tool conversation (system, user, two assistant turns calling a tool and their results, a final answer,
a second user turn answered with a `<think>` block, a third user turn) is rendered after every turn;
each render must extend the previous one, as text and as token ids. Where it does not, the template
rewrites earlier turns (thinking models strip `<think>` from earlier replies) and textenv appends deltas
rendered after a stand-in conversation instead (`ChatRenderer.added_text`), which keeps the exact tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from textenv.chat.renderer import ChatRenderer, Messages
from textenv.chat.transcript import rendering_pieces

def _call(index: int, query: str) -> dict:
    return {"id": f"call0000{index}", "type": "function", "function": {"name": "Calculator", "arguments": {"query": query}}}


# One call per assistant turn: Llama 3.1's template refuses more (several calls are tested per template).
SAMPLE_CONVERSATION: Messages = [
    {"role": "system", "content": "You answer with the calculator."},
    {"role": "user", "content": "What are 2+3 and 4*5?"},
    {"role": "assistant", "content": "", "tool_calls": [_call(1, "2+3")]},
    {"role": "tool", "content": "5", "tool_call_id": "call00001", "name": "Calculator"},
    {"role": "assistant", "content": "", "tool_calls": [_call(2, "4*5")]},
    {"role": "tool", "content": "20", "tool_call_id": "call00002", "name": "Calculator"},
    {"role": "assistant", "content": "5 and 20."},
    {"role": "user", "content": "And 6-1?"},
    {"role": "assistant", "content": "<think>6-1 is 5.</think>5."},
    {"role": "user", "content": "Thanks."},
]


@dataclass
class ConformanceStep:
    """One turn added to the conversation and whether the render grew by appending.

    Attributes:
        role (`str`): the added turn's roles (``"tool+tool"`` for two results).
        text_appended (`bool`): the new render starts with the previous one.
        tokens_appended (`bool`): the new render's token ids start with the previous one's.
        error (`str`, *optional*): the template raised on this conversation.
    """

    role: str
    text_appended: bool
    tokens_appended: bool
    error: Optional[str] = None


@dataclass
class Conformance:
    """The result of `check_conformance`: one step per added message."""

    steps: List[ConformanceStep] = field(default_factory=list)

    @property
    def append_only(self) -> bool:
        """Every render extended the previous one, as text and as tokens."""
        return all(step.text_appended and step.tokens_appended and step.error is None for step in self.steps)

    def summary(self) -> str:
        """One line: append-only, or which added messages rewrote earlier text or tokens."""
        if self.append_only:
            return f"append-only ({len(self.steps)} turns added one by one, text and tokens extended each time)"
        problems = []
        for index, step in enumerate(self.steps, start=1):
            if step.error:
                problems.append(f"turn {index} ({step.role}): the template raised {step.error}")
            elif not step.text_appended:
                problems.append(f"turn {index} ({step.role}) rewrote earlier text")
            elif not step.tokens_appended:
                problems.append(f"turn {index} ({step.role}) changed the tokens at the boundary")
        return "not append-only: " + "; ".join(problems) + " (deltas are rendered after a stand-in, tokens stay exact)"


def check_conformance(renderer: ChatRenderer, conversation: Messages = SAMPLE_CONVERSATION) -> Conformance:
    """Render `conversation` turn by turn with `renderer`, in the pieces a `Transcript` renders it in (the opening
    system and user messages together, then each message, consecutive tool results together), and check that each
    render extends the previous one as text and as token ids."""
    result = Conformance()
    previous_text, previous_ids = "", []
    length = 0
    for turn in rendering_pieces(conversation):
        length += len(turn)
        role = "+".join(message["role"] for message in turn)
        try:
            text = renderer.render(conversation[:length])
        except Exception as error:  # noqa: BLE001 - a template may refuse a conversation shape
            result.steps.append(ConformanceStep(role, False, False, f"{type(error).__name__}: {error}"))
            continue
        ids = renderer.encode(text).tolist()
        result.steps.append(
            ConformanceStep(role, text.startswith(previous_text), ids[: len(previous_ids)] == previous_ids)
        )
        previous_text, previous_ids = text, ids
    return result
