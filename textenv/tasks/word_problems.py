"""Arithmetic word problems solved with the `PythonInterpreter` tool (a generated stand-in for the legacy
GSM8K example): the model writes a program in the tool call, reads what it printed and answers as
`Result = N <submit>`.

The 1-shot prompt keeps the legacy example's bagel question but fixes its inconsistency (legacy showed
the output 72, the answer to a different question): here the program prints 8 and the answer is 8. As in
`textenv.tasks.calculator`, it is written in the bundled instruct model's chat format.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

from textenv.tasks.calculator import parse_result

TOOL_NAME = "PythonInterpreter"

SYSTEM_MESSAGE = (
    "You solve math word problems by writing a short Python program that prints the answer. Call it as "
    "<request><PythonInterpreter>code<call>, read what it printed, then answer as Result = number <submit>."
)

PROMPT = (
    f"<|im_start|>system\n{SYSTEM_MESSAGE}<|im_end|>\n"
    "<|im_start|>user\nOlivia has $23. She bought five bagels for $3 each. How much money does she have "
    "left?<|im_end|>\n"
    "<|im_start|>assistant\n<request><PythonInterpreter>\n"
    "money_initial = 23\n"
    "bagels = 5\n"
    "bagel_cost = 3\n"
    "money_spent = bagels * bagel_cost\n"
    "money_left = money_initial - money_spent\n"
    "print(money_left)\n"
    "<call>8\n<response>\nResult = 8 <submit><|im_end|>\n"
    "<|im_start|>user\n"
)

TOLERANCE = 0.1
NAMES = ("Mia", "Noah", "Ava", "Liam", "Zoe", "Omar", "Lena", "Ravi")


def _apples(rng: random.Random, name: str) -> tuple[str, float]:
    have, bags, per_bag = rng.randint(2, 30), rng.randint(2, 9), rng.randint(2, 12)
    question = (
        f"{name} has {have} apples and buys {bags} bags with {per_bag} apples in each bag. "
        f"How many apples does {name} have now?"
    )
    return question, have + bags * per_bag


def _bakery(rng: random.Random, name: str) -> tuple[str, float]:
    per_day, days = rng.randint(10, 40), rng.randint(2, 7)
    sold = rng.randint(1, per_day * days)
    question = (
        f"A bakery bakes {per_day} loaves of bread a day for {days} days and sells {sold} of them. "
        "How many loaves are left?"
    )
    return question, per_day * days - sold


def _sharing(rng: random.Random, name: str) -> tuple[str, float]:
    friends, each = rng.randint(2, 9), rng.randint(2, 15)
    question = (
        f"{name} shares {friends * each} marbles equally among {friends} friends. "
        "How many marbles does each friend get?"
    )
    return question, each


def _train(rng: random.Random, name: str) -> tuple[str, float]:
    speed, hours = rng.randint(40, 120), rng.randint(2, 9)
    question = f"A train travels at {speed} kilometres per hour for {hours} hours. How many kilometres does it travel?"
    return question, speed * hours


def _savings(rng: random.Random, name: str) -> tuple[str, float]:
    wage, weeks = rng.randint(10, 90), rng.randint(2, 12)
    question = (
        f"{name} earns {wage} dollars a week and saves half of it. "
        f"How many dollars does {name} save in {weeks} weeks?"
    )
    return question, wage / 2 * weeks


def _change(rng: random.Random, name: str) -> tuple[str, float]:
    price, pens = rng.randint(2, 9), rng.randint(2, 9)
    note = next(value for value in (20, 50, 100) if value > price * pens)
    question = (
        f"Pens cost {price} dollars each. {name} buys {pens} pens and pays with a {note} dollar note. "
        f"How many dollars of change does {name} get?"
    )
    return question, note - price * pens


TEMPLATES: tuple[Callable[[random.Random, str], tuple[str, float]], ...] = (
    _apples, _bakery, _sharing, _train, _savings, _change,
)


def format_query(question: str) -> str:
    """The text that follows `PROMPT` for one question: the user turn and the opening assistant turn."""
    return f"{question}<|im_end|>\n<|im_start|>assistant\n"


def generate_tasks(count: int, seed: int | None = None) -> tuple[list[str], list[float]]:
    """`count` random word problems (apples, bakery, sharing, train, savings, change), formatted with
    `format_query`, and their answers."""
    rng = random.Random(seed)
    queries, answers = [], []
    for _ in range(count):
        template, name = rng.choice(TEMPLATES), rng.choice(NAMES)
        question, answer = template(rng, name)
        queries.append(format_query(question))
        answers.append(float(answer))
    return queries, answers


def answer_match_reward(texts: Sequence[str], answers: Sequence[float]) -> list[float]:
    """1.0 where the text holds `Result = N <submit>` and N is within `TOLERANCE` (0.1) of the answer,
    else 0.0 (the legacy example's rule)."""
    rewards = []
    for text, answer in zip(texts, answers):
        result = parse_result(text)
        rewards.append(1.0 if result is not None and abs(result - float(answer)) < TOLERANCE else 0.0)
    return rewards
