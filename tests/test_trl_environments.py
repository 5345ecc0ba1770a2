"""TRL 1.x environments (`GRPOTrainer(environment_factory=..., tools=..., reward_funcs=...)`) run unchanged by
`GymScheduler`: one instance per episode, `reset(**row)` appended to the prompt, methods as JSON tools,
`get_reward` / reward functions as the episode reward, dict factories, masks, the bundled model, the CLI."""

from __future__ import annotations

import asyncio
import json
import re
import textwrap
import threading
from collections import Counter

import pytest

from textenv.cli import run_command
from textenv.engine.engine import Completion
from textenv.gym import Env, GymScheduler, ScriptedPolicy, TrlEnvironments, envs, read_completions
from textenv.gym.trl_environments import load_environment_factory, opening_messages
from textenv.gym.validation import EnvContractError, check_reset_result

CALL = '<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def call(name: str, **arguments) -> str:
    return CALL.format(name=name, arguments=json.dumps(arguments))


# ---------------------------------------------------------------- environments written as TRL documents them
class CounterEnv:
    """A counter the model raises with its `increment` tool; the reward is the final count."""

    instances: list = []

    def __init__(self):
        self.counter = 0
        self.reset_kwargs = None
        self.reward_calls = 0
        self.threads = {threading.get_ident()}
        CounterEnv.instances.append(self)

    def reset(self, **kwargs) -> str:
        self.threads.add(threading.get_ident())
        self.reset_kwargs = kwargs
        self.counter = kwargs.get("start", 0)
        return f" The counter is at {self.counter}."

    def increment(self, step: int) -> int:
        """Increment the counter by a given step.

        Args:
            step: The value to add to the counter.

        Returns:
            The new value of the counter.
        """
        self.threads.add(threading.get_ident())
        if step < 0:
            raise ValueError("step must be positive")
        self.counter += step
        return self.counter

    def get_reward(self) -> float:
        self.threads.add(threading.get_ident())
        self.reward_calls += 1
        return float(self.counter)

    def _helper(self) -> None:  # private: not a tool
        """Not offered."""

    @property
    def doubled(self) -> int:  # a property: not a tool, and never evaluated
        raise AssertionError("a property was evaluated")


class EchoEnv:
    """No `get_reward`: the reward comes from reward functions. One async tool."""

    def reset(self, **kwargs) -> None:
        self.said = []

    async def echo(self, text: str) -> str:
        """Say something back.

        Args:
            text: What to echo.
        """
        await asyncio.sleep(0)
        self.said.append(text)
        return text.upper()


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


@pytest.fixture(autouse=True)
def fresh_instances():
    CounterEnv.instances = []


def scripted(tokenizer, replies):
    """A policy whose k-th reply in an episode is ``replies[k]`` (the last one repeated)."""

    def reply(context: str) -> str:
        turn = context.count("<|im_start|>assistant") - 1
        return replies[min(turn, len(replies) - 1)]

    return ScriptedPolicy(tokenizer, reply)


def scheduler(tokenizer, replies, **kwargs):
    kwargs.setdefault("environment_factory", CounterEnv)
    return GymScheduler(None, tokenizer, policy=scripted(tokenizer, replies), max_turns=kwargs.pop("max_turns", 4), loss_scale="all", **kwargs)


ROW = {"prompt": [{"role": "system", "content": "Count carefully."}, {"role": "user", "content": "Raise the counter."}], "start": 2, "level": "easy"}


# ---------------------------------------------------------------- episodes
def test_one_instance_per_episode_and_reset_gets_the_row(tokenizer):
    rows = [dict(ROW), {**ROW, "start": 5}]
    sched = scheduler(tokenizer, [call("increment", step=1), "Done."])
    assert len(CounterEnv.instances) == 1  # the probe, as TRL builds one
    episodes = sched.run(rows, num_generations=2)
    used = CounterEnv.instances[1:]
    assert len(used) == 4 and len({id(env) for env in used}) == 4
    assert sorted((env.reset_kwargs for env in used), key=lambda kwargs: kwargs["start"]) == [rows[0], rows[0], rows[1], rows[1]]
    assert [episode.total_reward for episode in episodes] == [3.0, 3.0, 6.0, 6.0]
    assert [env.reward_calls for env in used] == [1, 1, 1, 1] and CounterEnv.instances[0].reward_calls == 0
    assert all(episode.env_name == "CounterEnv" and episode.finish_reason == "done" for episode in episodes)


def test_reset_string_is_appended_to_the_last_prompt_message(tokenizer):
    (episode,) = scheduler(tokenizer, ["Done."]).run([ROW])
    assert episode.messages[:2] == [
        {"role": "system", "content": "Count carefully."},
        {"role": "user", "content": "Raise the counter. The counter is at 2."},
    ]
    assert "<|im_start|>user\nRaise the counter. The counter is at 2.<|im_end|>" in episode.prompt
    assert "Count carefully." in episode.prompt
    (bare,) = scheduler(tokenizer, ["Done."]).run([{"start": 4}])  # no prompt: TRL's empty user message
    assert bare.messages[0] == {"role": "user", "content": " The counter is at 4."}
    (silent,) = scheduler(tokenizer, ["Done."], environment_factory=EchoEnv, reward_funcs=[lambda completions, **kw: [0.0]]).run([ROW])
    assert silent.messages[1] == {"role": "user", "content": "Raise the counter."}  # reset returned None


def test_tool_schemas_come_from_the_methods_signatures_and_docstrings(tokenizer):
    (episode,) = scheduler(tokenizer, ["Done."]).run([ROW])
    offered = [json.loads(line) for line in re.search(r"<tools>\n(.*?)\n</tools>", episode.prompt, re.S).group(1).splitlines()]
    assert offered == [{
        "type": "function",
        "function": {
            "name": "increment",
            "description": "Increment the counter by a given step.",
            "parameters": {"type": "object", "properties": {"step": {"type": "integer", "description": "The value to add to the counter."}}, "required": ["step"]},
            "return": {"type": "integer", "description": "The new value of the counter."},
        },
    }]
    assert episode.trajectory_infos[0] == {"environment": "CounterEnv", "tools": ["increment"]}


def test_tools_are_called_with_the_parsed_arguments_and_errors_come_back_as_trl_writes_them(tokenizer):
    first = "\n".join([call("increment", step=5), call("increment", step=-1), call("nope"), call("increment", size=1)])
    sched = scheduler(tokenizer, [first, "Done."])
    (episode,) = sched.run([ROW])
    roles = [message["role"] for message in episode.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "tool", "tool", "assistant"]
    results = episode.messages[3:7]
    assert [message["name"] for message in results] == ["increment", "increment", "nope", "increment"]
    assert results[0]["content"] == "7"
    assert results[1]["content"] == str({"error": "step must be positive"})
    assert results[2]["content"] == str({"error": "Tool nope not found."})
    assert results[3]["content"].startswith("{'error': ") and "unexpected keyword argument 'size'" in results[3]["content"]
    assert episode.total_reward == 7.0 and episode.final_reward == 7.0 and episode.step_rewards == [0.0, 0.0]
    assert sched.stats.tool_calls == 4 and sched.stats.tool_errors == 3
    assert "<tool_response>\n7\n</tool_response>" in episode.prompt


def test_get_reward_is_called_once_also_when_max_turns_ends_the_episode(tokenizer):
    (episode,) = scheduler(tokenizer, [call("increment", step=1)], max_turns=3).run([ROW])
    assert episode.finish_reason == "max_turns" and episode.num_turns == 3
    (env,) = CounterEnv.instances[1:]
    assert env.reward_calls == 1 and episode.total_reward == 5.0 and episode.history.reward == 5.0


def test_sync_environment_code_runs_on_one_thread_per_episode(tokenizer):
    scheduler(tokenizer, [call("increment", step=1), "Done."]).run([ROW, ROW])
    for env in CounterEnv.instances[1:]:
        assert len(env.threads) == 1 and env.threads != {threading.main_thread().ident}
    assert CounterEnv.instances[1].threads != CounterEnv.instances[2].threads


def test_masks_train_the_model_tokens_only(tokenizer):
    (episode,) = scheduler(tokenizer, [call("increment", step=5), "Done."]).run([ROW])
    query, response, mask = episode.history.split_query_response_tokens()
    assert tokenizer.decode(response[mask.bool()]) == call("increment", step=5) + "<|im_end|>Done.<|im_end|>"
    untrained = tokenizer.decode(response[~mask.bool()])
    assert "<tool_response>\n7\n</tool_response>" in untrained and "increment" not in untrained
    assert "The counter is at 2." in tokenizer.decode(query)


# ---------------------------------------------------------------- rewards
def test_reward_funcs_get_trl_arguments_and_are_summed(tokenizer):
    seen = []

    def length_reward(prompts, completions, **kwargs):
        seen.append((prompts, completions, kwargs))
        return [float(len(completions[0]))]

    async def constant(prompts, completions, **kwargs):
        return [0.5]

    sched = scheduler(tokenizer, [call("echo", text="hi"), "Bye."], environment_factory=EchoEnv, reward_funcs=[length_reward, constant])
    (episode,) = sched.run([ROW])
    assert episode.total_reward == 3.5  # assistant + tool + assistant, plus 0.5
    ((prompts, completions, kwargs),) = seen
    assert prompts == [episode.messages[:2]] and completions == [episode.messages[2:]]
    assert completions[0][1]["content"] == "HI"
    assert set(kwargs) == {"start", "level", "environments", "completion_ids", "trainer_state", "log_extra", "log_metric"}
    assert kwargs["start"] == [2] and kwargs["level"] == ["easy"]
    assert isinstance(kwargs["environments"][0], EchoEnv) and kwargs["environments"][0].said == ["hi"]
    (completion_ids,) = kwargs["completion_ids"]  # every token from the first reply on: model, tool and template tokens
    assert tokenizer.decode(completion_ids).startswith(call("echo", text="hi")) and "HI" in tokenizer.decode(completion_ids)
    assert tokenizer.decode(completion_ids).rstrip().endswith("Bye.<|im_end|>")
    assert kwargs["trainer_state"].global_step == 0


def test_reward_functions_run_before_get_reward_and_their_logs_are_kept(tokenizer, tmp_path):
    """TRL 1.16 appends `get_reward` to the reward functions: a `get_reward` that reads what a reward function set
    sees it (tests/test_trl_reward_order.py checks this order against TRL's own `_calculate_rewards`)."""

    class Judged(CounterEnv):
        def get_reward(self) -> float:
            return 10.0 * getattr(self, "judged", 0.0)

    def judge(completions, environments, log_extra, log_metric, **kwargs):
        environments[0].judged = 1.0
        log_extra("verdict", ["fine"])
        log_metric("judged", 1.0)
        return [0.5]

    sched = scheduler(tokenizer, ["Done."], environment_factory=Judged, reward_funcs=[judge])
    (episode,) = sched.run([ROW], completions_path=tmp_path / "completions.jsonl")
    assert episode.final_reward == 10.5
    assert episode.trajectory_infos[-1] == {"log_extra": {"verdict": "fine"}, "log_metric": {"judged": 1.0}}
    assert read_completions(tmp_path / "completions.jsonl")[0]["trajectory_infos"][-1]["log_extra"] == {"verdict": "fine"}


class EchoToolEnv:
    """Written as TRL's documentation shows it (docs/source/openenv.md, "Quick start"): state in ``__init__``,
    ``reset(**kwargs)`` returning ``None``, one tool method with a typed argument and an ``Args:`` docstring,
    and the reward read from the instance by a reward function over ``environments`` (the remote echo client
    replaced by its answer: the message back, rewarded by its length)."""

    def __init__(self):
        self.reward = 0.0

    def reset(self, **kwargs) -> str | None:
        self.reward = 0.0
        return None

    def echo(self, message: str) -> str:
        """
        Echo the message back from the environment.

        Args:
            message: The message to echo

        Returns:
            The echoed message.
        """
        self.reward = float(len(message))
        return message


def reward_func(environments, **kwargs):
    return [env.reward for env in environments]


def test_the_documented_quick_start_environment_runs_unchanged(tokenizer):
    dataset_row = {"prompt": [{"role": "user", "content": "Try to echo 'Hello World!' in the environment."}]}
    sched = scheduler(tokenizer, [call("echo", message="Hello World!"), "Done."], environment_factory=EchoToolEnv, reward_funcs=[reward_func])
    (episode,) = sched.run([dataset_row])
    assert episode.error is None and episode.finish_reason == "done"
    assert episode.total_reward == 12.0  # len("Hello World!"), read from the instance after the episode
    assert episode.messages[0] == dataset_row["prompt"][0]  # reset returned None: the prompt is unchanged
    assert [m["role"] for m in episode.messages[1:]] == ["assistant", "tool", "assistant"]
    assert episode.messages[2]["content"] == "Hello World!" and episode.messages[2]["name"] == "echo"


def test_get_reward_and_reward_funcs_add_up(tokenizer):
    (episode,) = scheduler(tokenizer, ["Done."], reward_funcs=[lambda prompts, completions, **kw: [10.0]]).run([ROW])
    assert episode.total_reward == 12.0 and episode.final_reward == 12.0


def test_a_failing_get_reward_is_an_episode_error_and_the_env_still_closes(tokenizer):
    class Broken(CounterEnv):
        def get_reward(self) -> float:
            raise RuntimeError("no score")

    (episode,) = scheduler(tokenizer, ["Done."], environment_factory=Broken).run([ROW])
    assert episode.finish_reason == "error" and episode.error["stage"] == "final_reward" and "no score" in episode.error["message"]
    assert episode.closed


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


# ---------------------------------------------------------------- the bundled model
def test_bundled_model_plays_trl_episodes_with_exact_model_tokens(bundled):
    model, tokenizer = bundled
    rows = [{"prompt": [{"role": "user", "content": f"Use the increment tool to add {n} to the counter, then say the result."}], "start": n} for n in (1, 2, 3)]
    sched = GymScheduler(model, tokenizer, environment_factory=CounterEnv, max_turns=2, loss_scale="all",
                         generation_kwargs={"do_sample": False, "max_new_tokens": 32})
    engine = sched._engine_for_call()
    seen: list[Completion] = []
    real = engine.generate

    async def recording(*args, **kwargs):
        completion = await real(*args, **kwargs)
        seen.append(completion)
        return completion

    engine.generate = recording
    episodes = sched.run(rows)
    assert all(not episode.errors and episode.finish_reason in ("done", "max_turns") for episode in episodes)
    turns = []
    for episode in episodes:
        history = episode.history
        own = [history.tokens[start:end].tolist() for (start, end), system in zip(history.token_spans, history.system_spans) if not system]
        _, response, mask = history.split_query_response_tokens()
        assert response[mask.bool()].tolist() == sum(own, [])  # the mask's 1s are exactly this episode's turns
        assert len(own) == episode.num_turns
        turns += [tuple(ids) for ids in own]
    assert Counter(turns) == Counter(tuple(completion.token_ids.tolist()) for completion in seen)  # ...and the model's ids
    used = CounterEnv.instances[1:]
    assert len(used) == 3 and [env.reward_calls for env in used] == [1, 1, 1]
    assert sorted(episode.total_reward for episode in episodes) == sorted(float(env.counter) for env in used)
    assert all("<tools>" in episode.prompt for episode in episodes)


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
