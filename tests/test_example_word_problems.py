"""The word-problem example's task: its prompt, the generated problems and their one-line solutions, the reward."""

import json
import re
import runpy
from pathlib import Path

import pytest

from textenv.tasks import word_problems
from textenv.tools import PythonInterpreter


def numbers(text: str) -> list[int]:
    return sorted(int(number) for number in re.findall(r"\d+", text))


def test_prompt_shows_each_shot_whose_program_prints_the_answer_it_shows():
    for question, program, printed in word_problems.SHOTS:
        assert PythonInterpreter()(program) == printed + "\n"
        assert numbers(program[len("print") :]) == numbers(question)
        shot = f"{question}<|im_end|>\n<|im_start|>assistant\n<request><PythonInterpreter>{program}<call>{printed}\n<response>\nResult = {printed} <submit>"
        assert shot in word_problems.PROMPT
    assert word_problems.PROMPT.count("<|im_start|>assistant\n") == len(word_problems.SHOTS) == len(word_problems.TEMPLATES)
    assert word_problems.PROMPT.endswith("<|im_start|>user\n")


def test_each_template_is_solved_by_its_one_line_program():
    problems = word_problems.generate_problems(60, seed=3)
    assert len({problem.question.split()[1] for problem in problems}) == len(word_problems.TEMPLATES)  # all templates are used
    printed = PythonInterpreter()("\n".join(problem.solution for problem in problems)).split()
    assert [float(value) for value in printed] == [float(problem.answer) for problem in problems]
    for problem in problems:
        assert re.fullmatch(r"print\(\d+( [-+*/] \d+)+\)", problem.solution)
        assert numbers(problem.solution[len("print") :]) == numbers(problem.question)  # the question's numbers, nothing else


def test_the_arithmetic_needs_the_tool():
    """Every operand has at least two digits and every answer is a whole number of at least two digits: the
    products, quotients and differences are beyond the bundled model's mental arithmetic, not its tool's."""
    for problem in word_problems.generate_problems(200, seed=5):
        assert min(numbers(problem.question)) >= 10
        assert problem.answer == int(problem.answer) and problem.answer >= 10


def test_word_problems_are_reproducible_and_well_formed():
    queries, answers = word_problems.generate_tasks(60, seed=7)
    assert (queries, answers) == word_problems.generate_tasks(60, seed=7)
    assert queries != word_problems.generate_tasks(60, seed=8)[0]
    assert all(query.endswith("?<|im_end|>\n<|im_start|>assistant\n") for query in queries)
    assert answers == [float(problem.answer) for problem in word_problems.generate_problems(60, seed=7)]


@pytest.mark.parametrize(
    "text, reward",
    [
        ("\nResult = 42 <submit>", 1.0),
        ("Result=42.05<submit>", 1.0),
        ("Result = 42.0 <submit>", 1.0),
        ("Result = 42.2 <submit>", 0.0),
        ("Result = 42", 0.0),
        ("42\n<response>", 0.0),
    ],
)
def test_word_problem_reward_tolerance(text, reward):
    assert word_problems.answer_match_reward([text], [42.0]) == [reward]


def test_tiny_run_measures_before_and_after_and_writes_its_run_directory(tmp_path):
    """The example measures the held-out problems sampled and greedy before and after training, and records
    every episode and step in its run directory for `textenv view`."""
    script = Path(__file__).resolve().parents[1] / "examples" / "python_interpreter.py"
    run_dir = tmp_path / "run"
    summary = runpy.run_path(str(script))["main"](
        ["--model", "tiny", "--ppo_steps", "1", "--batch-size", "2", "--mini-batch-size", "2", "--max-new-tokens", "8",
         "--eval-tasks", "2", "--threads", "0", "--no-progress", "--log-dir", str(tmp_path / "runs"), "--output_dir", str(run_dir)]
    )
    for figure in ("sampled_before", "sampled_after", "greedy_before", "greedy_after"):
        assert 0.0 <= summary[figure] <= 1.0
    assert summary["held_out_accuracy"] == summary["greedy_after"]
    assert 0 < summary["evaluation_seconds"] + summary["training_seconds"] <= summary["seconds"]
    assert (run_dir / "episodes.jsonl").is_file() and (run_dir / "steps.jsonl").is_file()
    phases = {json.loads(line).get("phase") for line in (run_dir / "episodes.jsonl").read_text().splitlines()}
    assert {"eval-before-sampled", "eval-before-greedy", "eval-after-sampled", "eval-after-greedy"} <= phases
