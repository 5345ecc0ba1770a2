"""Five environments from verifiers' own repository (tests/data/verifiers_environments, unchanged, MIT), loaded
with `vf.load_environment` and played offline: textenv's episodes equal verifiers' own rollouts against an
OpenAI stub serving the same replies (messages, rewards, metrics), and the bundled model plays them too."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers", reason="the verifiers tests need textenv[verifiers]")
pytest.importorskip("verifiers.legacy", reason="the classic verifiers tests need verifiers 0.3 (textenv[verifiers]); 0.4 has only v1")

from textenv.gym import GymScheduler  # noqa: E402
from textenv.gym.verifiers_envs import load_verifiers_environment  # noqa: E402
from tests.verifiers_stub import textenv_own, verifiers_own  # noqa: E402

FOLDER = Path(__file__).parent / "data" / "verifiers_environments"
OFFLINE_ARGS = {
    "tool_test": {"num_train_examples": 4, "num_eval_examples": 4},
    "reasoning_gym_env": {"gym": "basic_arithmetic", "num_train_examples": 4, "num_eval_examples": 4, "seed": 0},
    "reverse_text": {"dataset_name": str(FOLDER / "reverse_text" / "offline_dataset"), "dataset_split": "train"},
    "alphabet_sort": {"dataset_name": str(FOLDER / "alphabet_sort" / "offline_dataset"), "dataset_split": "train"},
    "self_reward": {"dataset_name": str(FOLDER / "self_reward" / "offline_dataset"), "dataset_split": "train"},
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """The environments' folders importable by module name; no network for datasets or the hub."""
    for name in OFFLINE_ARGS:
        monkeypatch.syspath_prepend(str(FOLDER / name))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def load(name: str):
    return load_verifiers_environment(name.replace("_", "-"), OFFLINE_ARGS[name])


def rows_by_question(env) -> dict:
    """The question (first user message) of each row -> the row, for the scripts."""
    table = {}
    for row in env.get_dataset():
        prompt = row["prompt"]
        table[next(message["content"] for message in prompt if message["role"] == "user")] = row
    return table


def script_for(name: str, env):
    """A script that is right with choice 0 and wrong with choice 1, so the rewards differ."""
    rows = rows_by_question(env)

    def tool_test(question, choice, turn):
        info = rows[question]["info"]
        tools = (json.loads(info.replace("'", '"')) if isinstance(info, str) else info)["tool_names"]
        call = (tools[0], {"x": 1 if tools[0] != "tool_B" else "a"}) if choice == 0 else ("tool_A" if tools[0] != "tool_A" else "tool_B", {"x": 1})
        return "", call

    def reasoning_gym_env(question, choice, turn):
        answer = env.rg_dataset[int(rows[question]["answer"])]["answer"]  # the row holds an index into reasoning-gym's data
        return f"<think>Compute.</think>\n<answer>{answer if choice == 0 else answer + '1'}</answer>", None

    def reverse_text(question, choice, turn):
        return f"<reversed_text>\n{question[::-1] if choice == 0 else question}\n</reversed_text>", None

    def alphabet_sort(question, choice, turn):
        truths = json.loads(rows[question]["answer"])["ground_truths"]
        names = truths[min(turn, len(truths) - 1)]
        tag = "alphabetical_sorted" if turn == 0 else "combined_alphabetical_sorted"
        return f"<{tag}>\n" + "\n".join(names if choice == 0 else names[::-1] + ["Extra"]) + f"\n</{tag}>", None

    def self_reward(question, choice, turn):
        return ["5", "I do not know."][choice], None

    return locals()[name]


def is_question(text: str) -> bool:
    return True  # these environments have no few-shot: the first user message is the question


@pytest.mark.parametrize("name", list(OFFLINE_ARGS))
def test_vendored_environment_equals_verifiers_own_rollout(name, tokenizer):
    env = load(name)
    expected = verifiers_own(env, env.get_dataset().select(range(2)), script_for(name, env), 2, is_question)
    env = load(name)
    got = textenv_own(env, env.get_dataset().select(range(2)), tokenizer, script_for(name, env), 2, is_question)
    assert got == expected
    if name != "self_reward":  # its JudgeRubric has no reward function: always 0
        assert len({json.loads(reward)[0] for _, reward in got}) > 1


def test_bundled_model_plays_a_vendored_tool_environment(bundled):
    """The real model on the engine: exact ids, the tool call parsed by the template's parser, verifiers' reward."""
    import torch

    model, tokenizer = bundled
    env = load("tool_test")
    torch.manual_seed(0)
    scheduler = GymScheduler(model, tokenizer, verifiers_env=env, generation_kwargs={"do_sample": False, "max_new_tokens": 40})
    episodes = scheduler.run(env.get_dataset().select(range(2)))
    for episode in episodes:
        assert episode.errors == [] and episode.history is not None
        info = episode.trajectory_infos[-1]
        assert info["stop_condition"] in ("max_turns_reached", "no_tools_called") and episode.final_reward == info["reward"]
        reply_ids = episode.history.tokens[episode.history.token_masks.bool()]
        assert tokenizer.decode(reply_ids).endswith(tokenizer.eos_token) or episode.turn_finish_reasons[-1] == "length"
    assert re.search(r"tool_[A-D]", json.dumps([episode.messages for episode in episodes]))
