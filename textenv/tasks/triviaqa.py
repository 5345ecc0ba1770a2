"""A TriviaQA-style task over a fictional encyclopedia: the model cannot know the answers, so it has to
search with the `Wiki` tool (a `WikiSearch` over the corpus) and answer as `Result=answer<submit>`.

The corpus and its questions ship with the examples (`examples/data/fictional_wiki.jsonl` and
`examples/data/fictional_wiki_questions.jsonl`); every place, person and fact in them is invented.
As in `textenv.tasks.calculator`, the 2-shot prompt is written in the bundled instruct model's chat
format, and each query closes the user turn and opens the assistant turn.
"""

from __future__ import annotations

import os
import random
import re
import string
from typing import Sequence

from textenv.jsonl import iter_jsonl

TOOL_NAME = "Wiki"

SYSTEM_MESSAGE = (
    "You answer questions about a fictional world that you know nothing about. Search its encyclopedia "
    "first: write <request><Wiki>search words<call>, read the passage after it, then answer as "
    "Result=answer<submit>."
)

# The passages are exactly what WikiSearch returns for these queries on the shipped corpus.
PROMPT = (
    f"<|im_start|>system\n{SYSTEM_MESSAGE}<|im_end|>\n"
    "<|im_start|>user\nWho first climbed Mount Kessarine?<|im_end|>\n"
    "<|im_start|>assistant\n<request><Wiki>Mount Kessarine first climbed<call>Mount Kessarine\n"
    "Mount Kessarine is the highest peak of the Dravel Range, rising 5,812 metres above sea level. "
    "It was first climbed in 1903 by the mountaineer Ilse Marrow. Greyfern tea is grown on its lower "
    "slopes.<response>\nResult=Ilse Marrow<submit><|im_end|>\n"
    "<|im_start|>user\nIn which province is Lake Imbrel?<|im_end|>\n"
    "<|im_start|>assistant\n<request><Wiki>Lake Imbrel province<call>Lake Imbrel\n"
    "Lake Imbrel is a freshwater lake in the province of Caldmere. Its deepest point is 214 metres "
    "below the surface. The lake freezes over only once every few decades.<response>\n"
    "Result=Caldmere<submit><|im_end|>\n"
    "<|im_start|>user\n"
)
PROMPT_QUESTIONS = ("Who first climbed Mount Kessarine?", "In which province is Lake Imbrel?")
PROMPT_SEARCHES = {"Mount Kessarine first climbed": "Mount Kessarine", "Lake Imbrel province": "Lake Imbrel"}

MAX_ANSWER_WORDS = 10
_ANSWER = re.compile(r"Result\s*=\s*(.*?)\s*<submit>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def format_query(question: str) -> str:
    """The text that follows `PROMPT` for one question: the user turn and the opening assistant turn."""
    return f"{question}<|im_end|>\n<|im_start|>assistant\n"


def load_questions(path: str | os.PathLike) -> list[dict]:
    """Read the question file: one `{"question": str, "answers": [str, ...], "title": str}` per line.
    Questions about the articles `PROMPT` shows are left out: the prompt itself would answer them."""
    records = list(iter_jsonl(path))
    shown_articles = set(PROMPT_SEARCHES.values())
    return [record for record in records if record["title"] not in shown_articles]


def split_questions(questions: Sequence[dict], held_out_every: int = 5) -> tuple[list[dict], list[dict]]:
    """`(training, held_out)`: every `held_out_every`-th question is held out for evaluation. Their facts
    never appear in a training episode, so only a search can answer them."""
    held_out = [record for index, record in enumerate(questions) if index % held_out_every == held_out_every - 1]
    training = [record for index, record in enumerate(questions) if index % held_out_every != held_out_every - 1]
    return training, held_out


def generate_tasks(
    questions: Sequence[dict], count: int, seed: int | None = None
) -> tuple[list[str], list[list[str]]]:
    """`count` questions drawn at random (with replacement), formatted with `format_query`, and their
    accepted answers.

    Args:
        questions: records from `load_questions`.
        count: how many tasks to draw.
        seed: seed of the draw.

    Returns:
        `(queries, answers)`: the query strings and, for each, the list of accepted answers.
    """
    rng = random.Random(seed)
    drawn = [rng.choice(questions) for _ in range(count)]
    return [format_query(record["question"]) for record in drawn], [list(record["answers"]) for record in drawn]


def normalise_answer(text: str) -> str:
    """Lower-case, drop punctuation and the articles a/an/the, collapse white space (SQuAD-style), so
    `"The Grey Heron."` and `"grey heron"` compare equal."""
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION))
    return " ".join(text.split())


def parse_answer(text: str) -> str | None:
    """The answer in `Result=answer<submit>`, or None."""
    match = _ANSWER.search(text)
    return match.group(1) if match else None


def answer_match_reward(texts: Sequence[str], answers: Sequence[Sequence[str]]) -> list[float]:
    """1.0 where the text holds `Result=answer<submit>` and the normalised answer contains one of the
    normalised accepted answers, else 0.0.

    Only the submitted answer counts, never the passage a tool returned, and an answer longer than
    `MAX_ANSWER_WORDS` words scores 0 so that copying a whole passage into `Result=` does not pay.
    """
    rewards = []
    for text, accepted in zip(texts, answers):
        answer = parse_answer(text)
        answer = normalise_answer(answer) if answer is not None else ""
        padded = f" {answer} "
        correct = 0 < len(answer.split()) <= MAX_ANSWER_WORDS and any(
            f" {normalise_answer(option)} " in padded for option in accepted
        )
        rewards.append(1.0 if correct else 0.0)
    return rewards
