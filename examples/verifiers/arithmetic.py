"""A verifiers environment, written as verifiers documents them: two-number additions and subtractions, scored
on the last number of the reply (``load_environment`` returns a `vf.SingleTurnEnv`; nothing in it knows textenv).

    import verifiers as vf
    env = vf.load_environment("arithmetic", num_train_examples=1024)   # with examples/verifiers on the path
"""

import random
import re

import verifiers as vf
from datasets import Dataset

SYSTEM_PROMPT = "Work out the result. End your reply with the number."


def make_rows(count: int, seed: int, largest: int) -> list:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b, op = rng.randint(1, largest), rng.randint(1, largest), rng.choice("+-")
        rows.append({"question": f"What is {a} {op} {b}?", "answer": str(a + b if op == "+" else a - b)})
    return rows


def load_environment(num_train_examples: int = 1024, num_eval_examples: int = 64, largest: int = 9, seed: int = 0) -> vf.Environment:
    parser = vf.Parser()

    def last_number_is_right(completion, answer, **kwargs) -> float:
        numbers = re.findall(r"-?\d+", parser.parse_answer(completion) or "")
        return 1.0 if numbers and numbers[-1] == answer else 0.0

    def short_reply(completion, **kwargs) -> float:  # a metric only: replies that stay short
        return 1.0 if len(parser.parse_answer(completion) or "") <= 40 else 0.0

    rubric = vf.Rubric(funcs=[last_number_is_right, short_reply], weights=[1.0, 0.0], parser=parser)
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(make_rows(num_train_examples, seed, largest)),
        eval_dataset=Dataset.from_list(make_rows(num_eval_examples, seed + 1, largest)),
        system_prompt=SYSTEM_PROMPT, parser=parser, rubric=rubric,
    )
