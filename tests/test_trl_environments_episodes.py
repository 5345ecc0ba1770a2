"""TRL 1.x environments (`GRPOTrainer(environment_factory=..., tools=..., reward_funcs=...)`) run unchanged by
`GymScheduler`, part 1: episodes (one instance per episode, `reset(**row)` appended to the prompt, methods as JSON
tools, masks), `get_reward` / reward functions as the episode reward, and the bundled model."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter

from textenv.engine.engine import Completion
from textenv.gym import GymScheduler, read_completions

from trl_environment_helpers import (  # noqa: F401 - fresh_instances: autouse
    ROW,
    CounterEnv,
    EchoEnv,
    call,
    fresh_instances,
    scheduler,
)


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
