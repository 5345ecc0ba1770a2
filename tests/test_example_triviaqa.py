"""The trivia example's task: the generated encyclopedia of towns, its search, the prompt, the held-out split
and the reward."""

from pathlib import Path

import pytest

from textenv.tasks import triviaqa

TOWNS_FILE = Path(__file__).resolve().parents[1] / "examples" / "data" / "fictional_towns.jsonl"


@pytest.fixture(scope="module")
def towns():
    return triviaqa.load_towns(TOWNS_FILE)


@pytest.fixture(scope="module")
def wiki():
    return triviaqa.build_search(TOWNS_FILE)


def test_the_shipped_encyclopedia_is_the_generated_one(towns, tmp_path):
    triviaqa.write_towns(tmp_path / "towns.jsonl", triviaqa.generate_towns())
    assert (tmp_path / "towns.jsonl").read_bytes() == TOWNS_FILE.read_bytes()
    assert len(towns) == triviaqa.TOWNS
    names = [town["town"] for town in towns] + [name for town in towns for name in town["mayor"].split()]
    assert len(set(names)) == len(names)  # every town and person name is unique
    assert triviaqa.generate_towns(5, seed=1) != triviaqa.generate_towns(5, seed=2)


def test_searching_for_a_question_returns_the_sentence_that_answers_it(towns, wiki):
    for town in towns:
        for kind, question in triviaqa.QUESTIONS.items():
            title, sentence = wiki(question.format(town=town["town"])).split("\n")
            assert title == town["town"] and str(town[kind]) in sentence and sentence.count(".") == 1, (kind, town)


def test_the_prompt_shows_what_the_tool_returns(towns, wiki):
    prompt = triviaqa.build_prompt(towns, wiki)
    for town, kind in zip(towns, triviaqa.PROMPT_KINDS):
        question = triviaqa.QUESTIONS[kind].format(town=town["town"])
        assert f"<request><Wiki>{question}<call>{wiki(question)}<response>\nResult={town[kind]}<submit>" in prompt
    assert prompt.endswith("<|im_start|>user\n") and prompt.count("<|im_start|>assistant") == len(triviaqa.PROMPT_KINDS)


def test_held_out_towns_are_never_asked_in_training_nor_shown_in_the_prompt(towns):
    training, held_out = triviaqa.split_towns(towns)
    assert len(held_out) == triviaqa.HELD_OUT_TOWNS and len(training) == triviaqa.TOWNS - triviaqa.HELD_OUT_TOWNS - len(triviaqa.PROMPT_KINDS)
    shown = {town["town"] for town in towns[: len(triviaqa.PROMPT_KINDS)]}
    held_names = {town["town"] for town in held_out}
    assert held_names.isdisjoint(town["town"] for town in training) and held_names.isdisjoint(shown)
    queries, answers = triviaqa.generate_tasks(training, 500, seed=3)
    assert not any(name in query for query in queries for name in held_names | shown)
    assert (queries, answers) == triviaqa.generate_tasks(training, 500, seed=3)
    assert {query.split()[0] for query in queries} == {"Who", "In"}  # all kinds are asked


def test_tasks_carry_the_fact_they_ask_for(towns):
    by_name = {town["town"]: town for town in towns}
    queries, answers = triviaqa.generate_tasks(towns, 60, seed=0)
    for query, (answer,) in zip(queries, answers):
        question = query.split("<|im_end|>")[0]
        kind, name = next((kind, name) for kind, template in triviaqa.QUESTIONS.items() for name in by_name if template.format(town=name) == question)
        assert answer == str(by_name[name][kind])


@pytest.mark.parametrize(
    "text, accepted, reward",
    [
        ("\nResult=Caldmere<submit>", ["Caldmere"], 1.0),
        ("\nResult = The Caldmere. <submit>", ["caldmere"], 1.0),  # case, article, punctuation
        ("Result=1572<submit>", ["1572"], 1.0),
        ("Result=Caldmeres<submit>", ["Caldmere"], 0.0),
        ("Result=Caldmere 1572 Kemvork Dreirktroum<submit>", ["Caldmere"], 0.0),  # listing facts does not pay
        ("Dringis\nThe mayor of Dringis is Caldmere.", ["Caldmere"], 0.0),  # no answer submitted
        ("Result=<submit>", ["Caldmere"], 0.0),
    ],
)
def test_trivia_reward(text, accepted, reward):
    assert triviaqa.answer_match_reward([text], [accepted]) == [reward]
