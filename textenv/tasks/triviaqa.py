"""A TriviaQA-style task over an invented encyclopedia of towns: the model cannot know the answers, so it has
to search with the `Wiki` tool (a `WikiSearch` over the articles) and answer as `Result=answer<submit>`.

Each article is generated from invented syllables (`generate_towns`, seeded) and states three facts, one per
sentence, each sentence naming the town: "T lies in the province of P. The mayor of T is M. T was founded in
Y." A question asks one of them (`QUESTIONS`). The search (`build_search`) indexes every sentence as a passage
of its own, so searching for the question returns the one sentence that answers it. The 3-shot prompt, in the
bundled instruct model's chat format, shows one question of each kind about the first three towns: the
question searched for, the sentence the tool returns and the answer copied from it. The last
`HELD_OUT_TOWNS` towns are asked only in evaluation, so a held-out question can be answered only by
searching.

What changed from the legacy example, and why: legacy TRL searched a Wikipedia index for TriviaQA questions,
which needs the internet and a model that reads long passages. textenv first shipped 55 handwritten
questions about a handwritten fictional wiki: with a 2-shot prompt the bundled SmolLM2-135M-Instruct
answered 0-2% of them (it wrote its guess into the search, or could not find the answer in a long passage),
too little for PPO to reinforce, and 11 held-out questions were too few to measure. Whole three-sentence
articles did not work either: searched by the town's name, the model answered every question with the
founding year of the last example (27% greedy) and PPO only reinforced that (stopped after 11 steps without
gain). A search that returns the answering sentence, one example per kind of question and 297 generated
training towns make the task learnable; the facts are still invented, so the tool is still needed.
"""

from __future__ import annotations

import json
import os
import random
import re
import string
from typing import Callable, Sequence

from textenv.jsonl import iter_jsonl
from textenv.tools import WikiSearch

TOOL_NAME = "Wiki"

SYSTEM_MESSAGE = (
    "You answer questions about the towns of a fictional country that you know nothing about. Search its "
    "encyclopedia for the town first: write <request><Wiki>town name<call>, read the article after it, then "
    "answer as Result=answer<submit>."
)
# question template and the town's field that answers it
QUESTIONS = {
    "mayor": "Who is the mayor of {town}?",
    "province": "In which province is {town}?",
    "year": "In which year was {town} founded?",
}
PROMPT_KINDS = ("mayor", "province", "year")  # the prompt's examples: towns 0, 1, 2, one kind each
TOWNS = 400
HELD_OUT_TOWNS = 100
TOWNS_SEED = 20261124
SENTENCE_CHARS = 60  # WikiSearch's passage_chars: every sentence of an article is a passage of its own

_ANSWER = re.compile(r"Result\s*=\s*(.*?)\s*<submit>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)

_ONSETS = ("br", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "sk", "dr", "gr", "kl", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ou")
_CODAS = ("", "n", "r", "l", "s", "th", "m", "nd", "rk", "st")


def generate_towns(count: int = TOWNS, seed: int = TOWNS_SEED, provinces: int = 40) -> list[dict]:
    """`count` invented towns, each ``{"title", "text", "town", "province", "mayor", "year"}`` (`title` and
    `text` are the article `WikiSearch` indexes). Every name is unique and made of invented syllables."""
    rng = random.Random(seed)
    used: set[str] = set()

    def name(syllables: int) -> str:
        while True:
            word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)).capitalize()
            if word not in used and 4 <= len(word) <= 11:
                used.add(word)
                return word

    province_names = [name(2) for _ in range(provinces)]
    towns = []
    for _ in range(count):
        town = name(rng.choice((2, 3)))
        facts = {"town": town, "province": rng.choice(province_names), "mayor": f"{name(2)} {name(2)}", "year": rng.randint(1100, 1899)}
        text = f"{town} lies in the province of {facts['province']}. The mayor of {town} is {facts['mayor']}. {town} was founded in {facts['year']}."
        towns.append({"title": town, "text": text, **facts})
    return towns


def write_towns(path: str | os.PathLike, towns: Sequence[dict]) -> None:
    """Write the towns as the encyclopedia file, one JSON object per line."""
    with open(path, "w", encoding="utf-8") as file:
        file.writelines(json.dumps(town) + "\n" for town in towns)


def load_towns(path: str | os.PathLike) -> list[dict]:
    """Read the encyclopedia file written by `write_towns`."""
    return list(iter_jsonl(path))


def build_search(path: str | os.PathLike) -> WikiSearch:
    """The `Wiki` tool: BM25 over the encyclopedia's sentences, returning the best one under its town's name."""
    return WikiSearch(path, passage_chars=SENTENCE_CHARS)


def split_towns(towns: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """`(training, held_out)`: the towns after the prompt's examples and before the last `HELD_OUT_TOWNS`, and
    those last ones, asked only in evaluation."""
    return list(towns[len(PROMPT_KINDS) : -HELD_OUT_TOWNS]), list(towns[-HELD_OUT_TOWNS:])


def format_query(question: str) -> str:
    """The text that follows the prompt for one question: the user turn and the opening assistant turn."""
    return f"{question}<|im_end|>\n<|im_start|>assistant\n"


def build_prompt(towns: Sequence[dict], search: Callable[[str], str]) -> str:
    """The 3-shot prompt: one question of each kind of `PROMPT_KINDS` about the first towns, each searched for
    with `search` (the `Wiki` tool, so the prompt shows exactly what it returns)."""
    shots = []
    for town, kind in zip(towns, PROMPT_KINDS):
        question = QUESTIONS[kind].format(town=town["town"])
        shots.append(
            f"<|im_start|>user\n{format_query(question)}<request><{TOOL_NAME}>{question}<call>{search(question)}"
            f"<response>\nResult={town[kind]}<submit><|im_end|>\n"
        )
    return f"<|im_start|>system\n{SYSTEM_MESSAGE}<|im_end|>\n" + "".join(shots) + "<|im_start|>user\n"


def generate_tasks(towns: Sequence[dict], count: int, seed: int | None = None) -> tuple[list[str], list[list[str]]]:
    """`count` questions about towns drawn at random (with replacement), each of a random kind, formatted with
    `format_query`, and their accepted answers (one each)."""
    rng = random.Random(seed)
    queries, answers = [], []
    for _ in range(count):
        town, kind = rng.choice(towns), rng.choice(list(QUESTIONS))
        queries.append(format_query(QUESTIONS[kind].format(town=town["town"])))
        answers.append([str(town[kind])])
    return queries, answers


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
    """1.0 where the text holds `Result=answer<submit>` and the normalised answer equals one of the normalised
    accepted answers, else 0.0.

    Only the submitted answer counts, never the article the tool returned, and it must be the fact itself:
    listing several facts of the article in `Result=` does not pay.
    """
    accepted_sets = [{normalise_answer(option) for option in accepted} for accepted in answers]
    submitted = [parse_answer(text) for text in texts]
    return [float(answer is not None and normalise_answer(answer) in options) for answer, options in zip(submitted, accepted_sets)]
