"""The word-problem example's task: its prompt, the generated problems, the reward."""

import pytest

from textenv.tasks import word_problems
from textenv.tools import PythonInterpreter


def test_word_problem_prompt_code_prints_the_answer_it_shows():
    example = word_problems.PROMPT.split("<|im_start|>assistant\n")[1]
    code = example.split("<request><PythonInterpreter>")[1].split("<call>")[0]
    shown = example.split("<call>")[1].split("<response>")[0]
    assert PythonInterpreter()(code) == shown == "8\n"
    assert "Result = 8 <submit>" in example


def test_word_problems_are_reproducible_and_well_formed():
    queries, answers = word_problems.generate_tasks(60, seed=7)
    assert (queries, answers) == word_problems.generate_tasks(60, seed=7)
    assert queries != word_problems.generate_tasks(60, seed=8)[0]
    assert all(query.endswith("?<|im_end|>\n<|im_start|>assistant\n") for query in queries)
    assert all(answer >= 0 for answer in answers)
    assert len({query.split()[0] for query in queries}) >= 4  # several templates are used


@pytest.mark.parametrize(
    "text, reward",
    [
        ("\nResult = 42 <submit>", 1.0),
        ("Result=42.05<submit>", 1.0),
        ("Result = 42.2 <submit>", 0.0),
        ("Result = 42", 0.0),
        ("42\n<response>", 0.0),
    ],
)
def test_word_problem_reward_tolerance(text, reward):
    assert word_problems.answer_match_reward([text], [42.0]) == [reward]
