"""The trivia example's task: its prompt, the shipped fictional encyclopedia and questions, the reward."""

from pathlib import Path

import pytest

from textenv.tasks import triviaqa
from textenv.tools import WikiSearch

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
CORPUS = EXAMPLES_DIR / "data" / "fictional_wiki.jsonl"
QUESTIONS = EXAMPLES_DIR / "data" / "fictional_wiki_questions.jsonl"


@pytest.fixture(scope="module")
def wiki():
    return WikiSearch(CORPUS)


def test_trivia_prompt_shows_what_the_wiki_tool_returns(wiki):
    for search, title in triviaqa.PROMPT_SEARCHES.items():
        passage = wiki(search)
        assert passage.startswith(title + "\n")
        assert f"<request><Wiki>{search}<call>{passage}<response>" in triviaqa.PROMPT


def test_every_shipped_question_is_answered_by_its_article(wiki):
    questions = triviaqa.load_questions(QUESTIONS)
    assert len(questions) >= 40
    for record in questions:
        passage = wiki(record["question"])
        assert passage.split("\n")[0] == record["title"], record["question"]
        assert record["answers"][0].lower() in passage.lower(), record["question"]


def test_trivia_questions_leave_out_the_prompt_articles_and_split_into_disjoint_sets():
    questions = triviaqa.load_questions(QUESTIONS)
    asked = {record["question"] for record in questions}
    assert not asked & set(triviaqa.PROMPT_QUESTIONS)
    assert {"Mount Kessarine", "Lake Imbrel"}.isdisjoint(record["title"] for record in questions)
    assert "How deep is Lake Imbrel?" in QUESTIONS.read_text()  # in the file, but answered by the prompt
    training, held_out = triviaqa.split_questions(questions)
    assert len(held_out) >= 8
    assert {r["question"] for r in training}.isdisjoint({r["question"] for r in held_out})
    assert len(training) + len(held_out) == len(questions)


@pytest.mark.parametrize(
    "text, accepted, reward",
    [
        ("\nResult=Caldmere<submit>", ["Caldmere"], 1.0),
        ("\nResult = The Grey Heron. <submit>", ["Grey Heron"], 1.0),  # case, article, punctuation
        ("Result=5,812 m<submit>", ["5,812 metres", "5812"], 1.0),
        ("Result=It is Quendar, on the Quen River<submit>", ["Quendar"], 1.0),
        ("Result=Caldmeres<submit>", ["Caldmere"], 0.0),  # whole words only
        ("Result=Ilse Marrow<submit>", ["Caldmere"], 0.0),
        ("Lake Imbrel\nLake Imbrel is a freshwater lake in the province of Caldmere.", ["Caldmere"], 0.0),  # no answer submitted
        ("Result=Lake Imbrel is a freshwater lake in the province of Caldmere and deep<submit>", ["Caldmere"], 0.0),  # copied passage
        ("Result=<submit>", ["Caldmere"], 0.0),
    ],
)
def test_trivia_reward(text, accepted, reward):
    assert triviaqa.answer_match_reward([text], [accepted]) == [reward]
