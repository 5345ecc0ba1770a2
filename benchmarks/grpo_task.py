"""The `grpo-vs-trl` workload's task: arithmetic with a calculator tool through JSON tool calls, written once as a
TRL 1.x `environment_factory` environment and used unchanged by both sides (`trl.GRPOTrainer(environment_factory=
CalculatorEnv)` and textenv's `GymScheduler(environment_factory=CalculatorEnv)`).

An episode: the model calls `calculate` with the expression, reads the result, calls `submit_answer` with it, and
then replies in plain text (which ends the episode). `get_reward` scores the submitted answer against the row's:
1.0 when it is within 0.01, else 0.0 (no answer submitted: 0.0). A reward >= 1 counts as solved.

The rows come from `textenv.tasks.calculator.generate_tasks` (seeded): ``{"prompt": [system, user question],
"answer": float}``; the system message says what to do, and the chat template adds the tools' schemas.

This module imports only the standard library (and `textenv.tasks.calculator` for the rows), so that both
sides and the tests can load it (also as ``textenv train --environment_factory benchmarks/grpo_task.py:CalculatorEnv``).
"""

from __future__ import annotations

import ast
import json
import operator

SYSTEM_PROMPT = (
    "You solve arithmetic questions with tools. First call `calculate` with the expression, then call "
    "`submit_answer` with the number it returned, then say the answer in one short sentence."
)
TOLERANCE = 0.01
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


class CalculatorEnv:
    """One episode of the calculator task (TRL's environment_factory protocol: `reset`, tools, `get_reward`)."""

    def __init__(self):
        self.answer: float | None = None
        self.submitted: float | None = None
        self.calls = 0

    def reset(self, **kwargs) -> str | None:
        """Start an episode of a dataset row (its columns as keyword arguments: `prompt`, `answer`)."""
        self.answer = float(kwargs["answer"]) if kwargs.get("answer") is not None else None
        self.submitted = None
        self.calls = 0
        return None

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / and parentheses.

        Args:
            expression: The expression to evaluate, for example "13-3" or "4*(2+5)".

        Returns:
            The result as a number, or an error message.
        """
        self.calls += 1
        try:
            value = _evaluate(ast.parse(str(expression).strip(), mode="eval").body)
        except Exception as error:  # noqa: BLE001 - a tool answers with text
            return f"Error: {type(error).__name__}"
        return _number_text(value)

    def submit_answer(self, answer: float) -> str:
        """Submit the final numeric answer to the question.

        Args:
            answer: The final answer, a number.

        Returns:
            A confirmation.
        """
        try:
            self.submitted = float(answer)
        except (TypeError, ValueError):
            return "Error: the answer must be a number."
        return "Answer received."

    def get_reward(self) -> float:
        """1.0 when the submitted answer is within 0.01 of the row's answer, else 0.0."""
        if self.answer is None or self.submitted is None:
            return 0.0
        return 1.0 if abs(self.submitted - self.answer) < TOLERANCE else 0.0


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("unsupported expression")


def _number_text(value: float) -> str:
    """`10` for whole numbers, else the value rounded to 4 decimals."""
    return str(int(value)) if float(value).is_integer() else str(round(value, 4))


def _example(question: str, expression: str, result: str) -> list[dict]:
    """One solved episode as chat messages: calculate, submit_answer, the answer in a sentence."""

    def call(name: str, arguments: dict) -> dict:
        # Arguments as JSON text: a `datasets.Dataset` (TRL's side) stores the rows in Arrow, which would merge the
        # two tools' argument dicts into one struct and add `"answer": null` to `calculate`'s (and so to the prompt).
        function = {"name": name, "arguments": json.dumps(arguments)}
        return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": function}]}

    return [
        {"role": "user", "content": question},
        call("calculate", {"expression": expression}),
        {"role": "tool", "name": "calculate", "content": result},
        call("submit_answer", {"answer": int(result)}),
        {"role": "tool", "name": "submit_answer", "content": "Answer received."},
        {"role": "assistant", "content": f"The answer is {result}."},
    ]


# Solved examples before every question (the bundled 135M model calls no tool zero-shot: 0 of 8 greedy); the rows
# take the first `shots` (default 2: a 648-token prompt with the tools' schemas, about 137 tokens per example).
EXAMPLES = [_example("What is 13-3?", "13-3", "10"), _example("What is 4*3?", "4*3", "12"),
            _example("What is 25+17?", "25+17", "42"), _example("What is 9*6?", "9*6", "54")]
DEFAULT_SHOTS = 2


def make_rows(count: int, seed: int, shots: int = DEFAULT_SHOTS) -> list[dict]:
    """`count` seeded rows ``{"prompt": [system, (`shots` solved examples,) user question], "answer": float}``
    (`generate_tasks(count, seed, plain=True)`: "What is a op b?", a and b in [0, 50), op in + - *)."""
    from textenv.tasks.calculator import generate_tasks

    if not 0 <= shots <= len(EXAMPLES):
        raise ValueError(f"shots must be in [0, {len(EXAMPLES)}], got {shots}.")
    questions, answers = generate_tasks(count, seed=seed, plain=True)
    opening = [{"role": "system", "content": SYSTEM_PROMPT}, *(message for example in EXAMPLES[:shots] for message in example)]
    return [{"prompt": [*opening, {"role": "user", "content": question}], "answer": answer} for question, answer in zip(questions, answers)]


def train_and_held_out_rows(train: int, held_out: int, seed: int = 0, shots: int = DEFAULT_SHOTS) -> tuple[list[dict], list[dict]]:
    """`train` training rows (seed `seed`) and `held_out` rows (seed `seed + 1`) whose questions are not among the
    training rows'."""
    train_rows = make_rows(train, seed, shots)
    seen = {row["prompt"][-1]["content"] for row in train_rows}
    candidates = make_rows(held_out + len(train_rows), seed + 1, shots)  # enough to replace any repeats
    held_out_rows = [row for row in candidates if row["prompt"][-1]["content"] not in seen][:held_out]
    return train_rows, held_out_rows
