"""TRL 1.x environments run by `GymScheduler`, part 2: dict factories and standalone tools, the checks at
construction, openings and final rewards of the Env contract, and the command line (`--environment_factory`,
`--tools`, `--reward_funcs`)."""

from __future__ import annotations

import json
import textwrap

import pytest

from textenv.cli import run_command
from textenv.gym import Env, GymScheduler, TrlEnvironments, envs, read_completions
from textenv.gym.trl_environments import load_environment_factory, opening_messages
from textenv.gym.validation import EnvContractError, check_reset_result

from trl_environment_helpers import (  # noqa: F401 - fresh_instances: autouse
    ROW,
    CounterEnv,
    EchoEnv,
    call,
    fresh_instances,
    multiply,
    scheduler,
    scripted,
)


# ---------------------------------------------------------------- dict factories and standalone tools
def test_dict_factory_picks_the_rows_environment_and_offers_only_its_tools(tokenizer):
    factories = {"counter": CounterEnv, "echo": EchoEnv}
    rows = [{**ROW, "environment": "counter"}, {**ROW, "environment": "echo"}]
    sched = scheduler(tokenizer, ["Done."], environment_factory=factories, reward_funcs=[lambda completions, **kw: [1.0]])
    counter, echo = sched.run(rows)
    assert (counter.env_name, echo.env_name) == ("counter", "echo")
    assert '"name": "increment"' in counter.prompt and '"name": "echo"' not in counter.prompt
    assert '"name": "echo"' in echo.prompt and '"name": "increment"' not in echo.prompt
    assert CounterEnv.instances[-1].reset_kwargs == ROW  # the `environment` field is not passed to reset
    assert counter.total_reward == 3.0 and echo.total_reward == 1.0  # get_reward 2 + 1; reward function 1


def test_unknown_or_missing_environment_name_is_an_episode_error_naming_the_known_ones(tokenizer):
    sched = scheduler(tokenizer, ["Done."], environment_factory={"counter": CounterEnv})
    unknown, missing = sched.run([{**ROW, "environment": "chess"}, ROW])
    assert unknown.error["stage"] == "config" and "'chess'" in unknown.error["message"] and "['counter']" in unknown.error["message"]
    assert missing.error["stage"] == "config" and "'environment' field" in missing.error["message"] and "['counter']" in missing.error["message"]
    assert unknown.env_name == "chess"


def test_standalone_tools_are_offered_and_called_with_the_methods(tokenizer):
    sched = scheduler(tokenizer, [call("multiply", a=6, b=7) + "\n" + call("increment", step=1), "Done."], tools=[multiply])
    (episode,) = sched.run([ROW])
    assert [message["content"] for message in episode.messages if message["role"] == "tool"] == ["42", "3"]
    assert episode.trajectory_infos[0]["tools"] == ["multiply", "increment"]
    assert "Multiply two integers." in episode.prompt


# ---------------------------------------------------------------- checks at construction
def test_an_environment_without_reset_is_refused(tokenizer):
    class NoReset:
        def look(self) -> str:
            """Look around."""
            return ""

    with pytest.raises(ValueError, match=r"environment_factory: each environment instance must define a callable `reset`"):
        GymScheduler(None, tokenizer, policy=scripted(tokenizer, [""]), environment_factory=NoReset, reward_funcs=[lambda **kw: [0.0]])
    with pytest.raises(ValueError, match=r"environment_factory\['x'\]: each environment"):
        TrlEnvironments({"x": NoReset}, reward_funcs=[lambda **kw: [0.0]])


def test_no_reward_source_is_refused_naming_both_options(tokenizer):
    with pytest.raises(ValueError, match=r"EchoEnv defines no `get_reward`.*reward_funcs=\[f, \.\.\.\].*get_reward\(self\) -> float"):
        GymScheduler(None, tokenizer, policy=scripted(tokenizer, [""]), environment_factory=EchoEnv)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(environment_factory=CounterEnv, gym_env="math_env"), "gym_env .* or environment_factory"),
        (dict(tools=[multiply]), "go with environment_factory"),
        (dict(environment_factory=CounterEnv, tools=[lambda x: x]), "tool '<lambda>' cannot be described"),
        (dict(environment_factory=CounterEnv, tools=[CounterEnv.increment]), r"several tools are named \['increment'\]"),
        (dict(environment_factory={}), "the dict is empty"),
        (dict(environment_factory=42), "is a int; expected a class"),
    ],
)
def test_bad_arguments_are_refused(tokenizer, kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        GymScheduler(None, tokenizer, policy=scripted(tokenizer, [""]), **kwargs)


# ---------------------------------------------------------------- the Env contract: openings
def test_reset_may_return_a_whole_opening_conversation():
    opening = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}]
    assert check_reset_result((opening, None, None), "E") == (opening, {}, None)
    for bad, message in [
        (([], {}, None), "empty opening"),
        (([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], {}, None), "ends with an assistant"),
        (([{"role": "user", "content": 3}], {}, None), r"opening\[0\]"),
        ((opening, {}, "another system"), "give one of them"),
    ]:
        with pytest.raises(EnvContractError, match=message):
            check_reset_result(bad, "E")
    with pytest.raises(TypeError, match="expected a string .* or None"):
        opening_messages(None, 3, "E")


class OpeningEnv(Env):
    """A Gym env of the extended contract: a few-shot opening from `reset`, a reward for the whole episode."""

    async def reset(self, config):
        shot = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}, {"role": "user", "content": config.data_dict["q"]}]
        return shot, {}, "Answer with a number."

    async def step(self, action):
        return None, 0.25, True, {}

    async def final_reward(self, messages):
        return self.env_config.get("final", len(messages))

    async def close(self):
        pass


def test_gym_envs_may_return_an_opening_conversation_and_a_final_reward(tokenizer):
    envs["opening"] = OpeningEnv
    try:
        sched = GymScheduler(None, tokenizer, policy=scripted(tokenizer, ["4"]), gym_env="opening")
        good, bad = sched.run([{"q": "2+2?"}, {"q": "3+3?", "env_config": {"final": float("nan")}}])
    finally:
        envs.pop("opening")
    assert [message["content"] for message in good.messages] == ["Answer with a number.", "1+1?", "2", "2+2?", "4"]
    assert "<|im_start|>assistant\n2<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>" in good.prompt
    assert good.final_reward == 5.0 and good.total_reward == 5.25 and good.history.reward == 5.25
    assert bad.error["stage"] == "final_reward" and "expected a finite float" in bad.error["message"]


# ---------------------------------------------------------------- the command line
ENV_FILE = '''
class CounterEnv:
    def reset(self, **kwargs) -> str:
        self.counter = kwargs["start"]
        return f" Start at {self.counter}."

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: The value to add.
        """
        self.counter += step
        return self.counter

    def get_reward(self) -> float:
        return float(self.counter)


class Plain:
    def reset(self, **kwargs) -> None:
        return None


def bonus(prompts, completions, **kwargs):
    return [100.0]
'''


@pytest.fixture()
def env_files(tmp_path):
    env_file = tmp_path / "my_envs.py"
    env_file.write_text(textwrap.dedent(ENV_FILE))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": "Count."}], "start": n}) + "\n" for n in (3, 4)))
    return env_file, rows


def test_rollout_with_an_environment_factory_file(env_files, tmp_path):
    env_file, rows = env_files
    out = tmp_path / "completions.jsonl"
    summary = run_command([
        "rollout", "--model", "tiny", "--dataset", str(rows), "--environment_factory", f"{env_file}:CounterEnv",
        "--reward_funcs", f"{env_file}:bonus", "--max_turns", "2", "--max_new_tokens", "3", "--output", str(out),
        "--no_progress", "--temperature", "0",
    ])
    assert summary["episodes"] == 2 and summary["errors"] == 0
    records = sorted(read_completions(out), key=lambda record: record["row_index"])
    assert [record["env"] for record in records] == ["CounterEnv", "CounterEnv"]
    assert [record["messages"][0]["content"] for record in records] == ["Count. Start at 3.", "Count. Start at 4."]
    assert [record["final_reward"] for record in records] == [103.0, 104.0]  # tiny model calls no tool
    assert all(record["trajectory_infos"][0]["tools"] == ["increment"] for record in records)


def test_train_gym_with_an_environment_factory_module(env_files, tmp_path, monkeypatch):
    env_file, rows = env_files
    monkeypatch.syspath_prepend(str(env_file.parent))
    summary = run_command([
        "train", "--task", "gym", "--model", "tiny", "--dataset", str(rows), "--environment_factory", "my_envs:CounterEnv",
        "--max_turns", "1", "--max_new_tokens", "3", "--ppo_steps", "1", "--batch_size", "2", "--mini_batch_size", "1",
        "--ppo_epochs", "1", "--output_dir", str(tmp_path / "out"), "--no_progress",
    ])
    assert summary["steps"] == 1 and summary["reward_means"] == [3.5]
    assert sorted(record["final_reward"] for record in read_completions(tmp_path / "out" / "completions.jsonl")) == [3.0, 4.0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--environment_factory", "x.py:A", "--gym_env", "math_env"], "give one of them"),
        (["--tools", "m:f"], "go with --environment_factory"),
    ],
)
def test_gym_options_that_conflict_are_refused(argv, message):
    from textenv.training.command import parse

    with pytest.raises(ValueError, match=message):
        parse(["--task", "gym", "--dataset", "rows.jsonl", *argv])


def test_option_specs_name_files_modules_and_dicts(env_files):
    env_file, _ = env_files
    factories = load_environment_factory(f"count={env_file}:CounterEnv, plain={env_file}:Plain")
    assert list(factories) == ["count", "plain"] and factories["count"].__name__ == "CounterEnv"
    with pytest.raises(ValueError, match="--environment_factory: 'nocolon' is not of the form"):
        load_environment_factory("nocolon")
    with pytest.raises(ValueError, match="has no attribute 'Missing'"):
        load_environment_factory(f"{env_file}:Missing")
    with pytest.raises(ValueError, match="name=module:Class for every environment"):
        load_environment_factory(f"a={env_file}:CounterEnv,{env_file}:Plain")
