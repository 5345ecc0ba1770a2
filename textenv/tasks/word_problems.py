"""Arithmetic word problems solved with the `PythonInterpreter` tool (a generated stand-in for the legacy
GSM8K example): the model writes a one-line program in the tool call, reads what it printed and answers as
`Result = N <submit>`.

What changed from the legacy example, and why: from the legacy 1-shot prompt (Olivia's bagels, a six-line
program with named variables) the bundled SmolLM2-135M-Instruct wrote long, broken programs (wrong variables,
prose inside the code) and solved none of the problems, sampled or greedy, so PPO had no reward to learn
from. Here

- every problem is solved by one line, `print(expression)`, of its question's numbers: a product (apples in
  bags, a train), a quotient (sharing marbles), a difference (library books) or two operations (a bakery,
  change from a note);
- the prompt shows one worked example of each of these six templates (other names and numbers), in the
  model's chat format as in `textenv.tasks.calculator`: the model has to pick the right shape and put the
  question's numbers in it, which it does some of the time, and which PPO reinforces;
- the numbers are large (two-digit factors, four-digit differences), so a 135M model cannot do the arithmetic
  in its head: the tool is still needed, as in the calculator task;
- the templates that needed a third operation or a constant (apples already owned plus bags bought, saving
  half of a wage) were dropped or simplified: the model got none of them right, even greedily;
- the episodes are short (a one-line call, then `Result = N <submit>`), so 40 new tokens per turn do.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

from textenv.tasks.calculator import parse_result

TOOL_NAME = "PythonInterpreter"

SYSTEM_MESSAGE = (
    "You solve math word problems by writing a one-line Python program that prints the answer. Call it as "
    "<request><PythonInterpreter>print(expression)<call>, read what it printed, then answer as "
    "Result = number <submit>."
)


def _shot(question: str, solution: str, printed: str) -> str:
    """One worked example of the prompt: the user's question, the tool call and its output, the answer."""
    return (
        f"<|im_start|>user\n{question}<|im_end|>\n"
        f"<|im_start|>assistant\n<request><PythonInterpreter>{solution}<call>{printed}\n<response>\n"
        f"Result = {printed} <submit><|im_end|>\n"
    )


# (question, program, what it prints): the prompt's worked examples, one for each template below.
SHOTS = (
    ("Olivia buys 12 bags with 18 apples in each bag. How many apples does Olivia buy?",
     "print(12 * 18)", "216"),
    ("A bakery bakes 24 loaves of bread a day for 15 days and sells 130 of them. How many loaves are left?",
     "print(24 * 15 - 130)", "230"),
    ("Olivia shares 312 marbles equally among 13 friends. How many marbles does each friend get?",
     "print(312 / 13)", "24.0"),
    ("A train travels at 64 kilometres per hour for 17 hours. How many kilometres does it travel?",
     "print(64 * 17)", "1088"),
    ("A library has 3715 books and lends out 1948 of them. How many books are still in the library?",
     "print(3715 - 1948)", "1767"),
    ("Pens cost 13 dollars each. Olivia buys 15 pens and pays with a 500 dollar note. "
     "How many dollars of change does Olivia get?",
     "print(500 - 13 * 15)", "305"),
)

PROMPT = (
    f"<|im_start|>system\n{SYSTEM_MESSAGE}<|im_end|>\n"
    + "".join(_shot(*shot) for shot in SHOTS)
    + "<|im_start|>user\n"
)

TOLERANCE = 0.1
NAMES = ("Mia", "Noah", "Ava", "Liam", "Zoe", "Omar", "Lena", "Ravi")


@dataclass(frozen=True)
class Problem:
    """One word problem: its question, a one-line program that solves it and the answer it prints."""

    question: str
    solution: str
    answer: float


def _apples(rng: random.Random, name: str) -> Problem:
    bags, per_bag = rng.randint(12, 49), rng.randint(12, 49)
    question = f"{name} buys {bags} bags with {per_bag} apples in each bag. How many apples does {name} buy?"
    return Problem(question, f"print({bags} * {per_bag})", bags * per_bag)


def _bakery(rng: random.Random, name: str) -> Problem:
    per_day, days = rng.randint(12, 99), rng.randint(12, 31)
    sold = rng.randint(10, per_day * days - 10)
    question = (
        f"A bakery bakes {per_day} loaves of bread a day for {days} days and sells {sold} of them. "
        "How many loaves are left?"
    )
    return Problem(question, f"print({per_day} * {days} - {sold})", per_day * days - sold)


def _sharing(rng: random.Random, name: str) -> Problem:
    friends, each = rng.randint(12, 39), rng.randint(12, 49)
    question = (
        f"{name} shares {friends * each} marbles equally among {friends} friends. "
        "How many marbles does each friend get?"
    )
    return Problem(question, f"print({friends * each} / {friends})", each)


def _train(rng: random.Random, name: str) -> Problem:
    speed, hours = rng.randint(41, 99), rng.randint(12, 29)
    question = f"A train travels at {speed} kilometres per hour for {hours} hours. How many kilometres does it travel?"
    return Problem(question, f"print({speed} * {hours})", speed * hours)


def _library(rng: random.Random, name: str) -> Problem:
    books = rng.randint(1000, 9999)
    lent = rng.randint(100, books - 100)
    question = f"A library has {books} books and lends out {lent} of them. How many books are still in the library?"
    return Problem(question, f"print({books} - {lent})", books - lent)


def _change(rng: random.Random, name: str) -> Problem:
    price, pens = rng.randint(12, 49), rng.randint(12, 29)
    note = next(value for value in (500, 1000, 2000) if value >= price * pens + 10)
    question = (
        f"Pens cost {price} dollars each. {name} buys {pens} pens and pays with a {note} dollar note. "
        f"How many dollars of change does {name} get?"
    )
    return Problem(question, f"print({note} - {price} * {pens})", note - price * pens)


TEMPLATES: tuple[Callable[[random.Random, str], Problem], ...] = (
    _apples, _bakery, _sharing, _train, _library, _change,
)


def format_query(question: str) -> str:
    """The text that follows `PROMPT` for one question: the user turn and the opening assistant turn."""
    return f"{question}<|im_end|>\n<|im_start|>assistant\n"


def generate_problems(count: int, seed: int | None = None) -> list[Problem]:
    """`count` random word problems (apples, bakery, sharing, train, library, change) with their one-line
    solutions and answers."""
    rng = random.Random(seed)
    problems = []
    for _ in range(count):
        template, name = rng.choice(TEMPLATES), rng.choice(NAMES)
        problems.append(template(rng, name))
    return problems


def generate_tasks(count: int, seed: int | None = None) -> tuple[list[str], list[float]]:
    """`count` random word problems (see `generate_problems`), formatted with `format_query`, and their
    answers."""
    problems = generate_problems(count, seed)
    return [format_query(problem.question) for problem in problems], [float(problem.answer) for problem in problems]


def answer_match_reward(texts: Sequence[str], answers: Sequence[float]) -> list[float]:
    """1.0 where the text holds `Result = N <submit>` and N is within `TOLERANCE` (0.1) of the answer,
    else 0.0 (the legacy example's rule)."""
    rewards = []
    for text, answer in zip(texts, answers):
        result = parse_result(text)
        rewards.append(1.0 if result is not None and abs(result - float(answer)) < TOLERANCE else 0.0)
    return rewards
