"""The gym contracts, registries, plugin loading, row loading and the built-in envs."""

import asyncio
import json
from pathlib import Path

import pytest

from textenv.gym import (
    ContextManager,
    Env,
    EnvContractError,
    GymScheduler,
    RolloutInferRequest,
    ScriptedPolicy,
    SimpleMathEnv,
    context_managers,
    envs,
    load_plugins,
    load_rows,
    make_request,
    register_env,
    resolve_context_manager,
    resolve_env,
)
from textenv.gym.builtin import answers_match, extract_answer
from textenv.gym.validation import check_reset_result, check_step_result

PLUGIN = Path(__file__).parent / "plugins" / "gym_guess_plugin.py"


# ---------------------------------------------------------------- contracts
def test_env_and_context_manager_are_abstract():
    with pytest.raises(TypeError):
        Env({})
    with pytest.raises(TypeError):
        ContextManager({})


def test_request_fields_and_unique_ids():
    request = make_request({"messages": [{"role": "user", "content": "q"}], "tools": ["t"], "problem": "1+1", "env_config": {"name": "math_env"}})
    assert request.messages == [{"role": "user", "content": "q"}]
    assert request.tools == ["t"]
    assert request.data_dict == {"problem": "1+1", "env_config": {"name": "math_env"}}
    assert request.images == [] and request.objects == {}
    assert request.uuid.startswith("chatcmpl-") and make_request({}).uuid != request.uuid


@pytest.mark.parametrize(
    "result, message",
    [
        (("obs", {}), "3-tuple"),
        ((1, {}, None), "observation of type int"),
        (("obs", [], None), "info of type list"),
        (("obs", {}, 5), "system_message"),
    ],
)
def test_reset_result_validation(result, message):
    with pytest.raises(EnvContractError, match=message):
        check_reset_result(result, "E")


@pytest.mark.parametrize(
    "result, message",
    [
        (("obs", 1.0, False), "4-tuple"),
        (None, "4-tuple"),
        (("obs", "1", False, {}), "reward"),
        (("obs", float("nan"), False, {}), "reward"),
        (("obs", 1.0, "yes", {}), "done"),
        ((None, 1.0, False, {}), "next_observation"),
    ],
)
def test_step_result_validation(result, message):
    with pytest.raises(EnvContractError, match=message):
        check_step_result(result, "E")


def test_step_result_normalisation():
    assert check_step_result((None, 1, 1, None), "E") == (None, 1.0, True, {})
    assert check_reset_result(("o", None, ""), "E") == ("o", {}, None)


# ---------------------------------------------------------------- registries and plugins
def test_builtin_registrations():
    assert envs["math_env"] is SimpleMathEnv
    assert {"tool_env", "math_env"} <= set(envs)
    assert {"dummyContextManager", "sliding_window"} <= set(context_managers)
    assert resolve_context_manager({}, None) is context_managers["dummyContextManager"]


def test_row_name_wins_and_unknown_name_lists_available():
    assert resolve_env({"name": "tool_env"}, default="math_env") is envs["tool_env"]
    assert resolve_env({}, default="math_env") is SimpleMathEnv
    with pytest.raises(ValueError, match=r"Environment 'nope' not found. Available: \[.*'math_env'"):
        resolve_env({"name": "nope"}, default="math_env")
    with pytest.raises(ValueError, match="not chosen"):
        resolve_env({}, default=None)


def test_abstract_registration_stub_is_refused():
    class Stub(Env):
        pass

    envs["stub"] = Stub
    try:
        with pytest.raises(TypeError, match="abstract"):
            resolve_env({"name": "stub"})
    finally:
        envs.pop("stub")


def test_plugin_file_registers_classes_once():
    (module,) = load_plugins(str(PLUGIN))
    assert envs["guess_env"] is module.GuessEnv
    assert context_managers["keep_last_round"] is module.KeepLastRound
    assert load_plugins([PLUGIN]) == [module]  # not executed again
    with pytest.raises(FileNotFoundError):
        load_plugins("/no/such/plugin.py")


def test_register_decorator():
    @register_env("decorated")
    class Decorated(SimpleMathEnv):
        pass

    try:
        assert envs["decorated"] is Decorated
    finally:
        envs.pop("decorated")


def test_custom_env_from_plugin_runs(tokenizer):
    load_plugins(PLUGIN)
    guesses = iter(["5", "8", "7"])
    policy = ScriptedPolicy(tokenizer, lambda context: next(guesses))
    sched = GymScheduler(tokenizer=tokenizer, policy=policy, gym_env="guess_env", max_turns=5)
    (episode,) = sched.run([{"secret": 7}])
    assert [m["content"] for m in episode.messages if m["role"] == "user"] == [
        "Guess my number between 1 and 10.", "higher", "lower",
    ]
    assert episode.step_rewards == [0.0, 0.0, 1.0] and episode.finish_reason == "done"
    assert episode.trajectory_infos[0] == {"secret": 7}


# ---------------------------------------------------------------- rows
def test_load_rows_from_jsonl_and_dataset(tmp_path):
    from datasets import Dataset

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"problem": "1+1", "env_config": {"name": "math_env"}}) + "\n\n" + json.dumps({"problem": "2"}) + "\n")
    assert [row["problem"] for row in load_rows(path)] == ["1+1", "2"]
    dataset = Dataset.from_list([{"problem": "3", "solution": "3"}])
    assert load_rows(dataset) == [{"problem": "3", "solution": "3"}]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{\"a\": 1}\n[1]\n")
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_rows(bad)


# ---------------------------------------------------------------- built-in envs
@pytest.mark.parametrize(
    "reply, solution, correct",
    [
        ("<think>2+2</think><answer>4</answer>", "4", True),
        ("so \\boxed{1/2}", "0.5", True),
        ("the answer is 12.", "12", True),
        ("<answer>5</answer>", "4", False),
        ("no idea", "4", False),
        ("<answer>Paris</answer>", "paris.", True),
    ],
)
def test_math_answer_checking(reply, solution, correct):
    assert answers_match(extract_answer(reply), solution) is correct


def test_math_env_contract():
    env = SimpleMathEnv({})
    obs, info, system = asyncio.run(env.reset(RolloutInferRequest(data_dict={"problem": "2+2?", "solution": "4"})))
    assert obs == "2+2?" and info == {} and "<answer>" in system
    wrong = asyncio.run(env.step([{"role": "assistant", "content": "<answer>5</answer>"}]))
    right = asyncio.run(env.step([{"role": "assistant", "content": "<answer>4</answer>"}]))
    assert wrong[1:3] == (0.0, False) and "not correct" in wrong[0]
    assert right[1:] == (1.0, True, {"math_reward": 1.0, "stop_reason": "Correct"})


def test_math_env_episode(tokenizer):
    replies = iter(["<answer>3</answer>", "<answer>4</answer>"])
    sched = GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, lambda c: next(replies)), gym_env="math_env", max_turns=3)
    (episode,) = sched.run([{"problem": "2+2?", "solution": "4"}])
    assert episode.step_rewards == [0.0, 1.0] and episode.total_reward == 1.0
    assert episode.trajectory_infos[-1]["stop_reason"] == "Correct"


def test_tool_env_calls_textenv_tools(tokenizer):
    stops_seen = []
    replies = iter(["<request><Calculator>6*7<call>", "42<submit>"])

    def policy(contexts, stop_strings):
        stops_seen.append(tuple(stop_strings))
        return ScriptedPolicy(tokenizer, lambda c: next(replies))(contexts, stop_strings)

    sched = GymScheduler(tokenizer=tokenizer, policy=policy, gym_env="tool_env", max_turns=3)
    (episode,) = sched.run([{"query": "What is 6*7?", "answer": "42"}])
    assert episode.messages[3] == {"role": "user", "content": "42"}  # the calculator's response
    assert episode.step_rewards == [0.0, 1.0]
    assert stops_seen[0] == ("<call>",)
    assert "<request><Calculator>" in episode.messages[0]["content"]  # system prompt keeps the syntax


def test_tool_env_unknown_tool_config_is_a_config_error(tokenizer):
    sched = GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, lambda c: "x"), gym_env="tool_env")
    (episode,) = sched.run([{"query": "q", "env_config": {"tools": ["Nope"]}}])
    assert episode.error["stage"] == "config" and "Calculator" in episode.error["message"]


def test_scheduler_reads_a_jsonl_path(tokenizer, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"problem": "2+2?", "solution": "4"}) + "\n" + json.dumps({"problem": "1+1?", "solution": "3"}) + "\n")
    sched = GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, lambda c: "<answer>4</answer>"), gym_env="math_env", max_turns=1)
    assert [e.total_reward for e in sched.run(path)] == [1.0, 0.0]
