"""verifiers v1 tasksets (verifiers 0.4.0) on textenv: `GymScheduler(verifiers_env=load_v1_environment(ID))`.

verifiers' own `Env.run_episode` plays each episode (its chat harness as a subprocess, its interception server,
the task's MCP tools and rewards); textenv's endpoint answers the model requests from its episode driver.
The tasksets are verifiers' own, vendored under tests/data/verifiers_v1 (MIT): its e2e fixtures `echo-v1`,
`echo-tool-v1` (an MCP tool), `echo-user-sim-v1` (multi-turn: a scripted user) and `duet-v1` (two agents, refused),
and its `glossary` environment (a task-scoped MCP tool). These run where verifiers 0.4 is installed (.venv-vllm, the
vLLM part of `make test`; tests/scope.py), and skip elsewhere.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path

import pytest

if not importlib.metadata.version("verifiers").startswith("0.4.") if importlib.util.find_spec("verifiers") else True:
    pytest.skip("the verifiers v1 tests need verifiers 0.4 (textenv[verifiers-v1], installed in .venv-vllm)", allow_module_level=True)

from textenv.cli import run_command  # noqa: E402
from textenv.gym import GymScheduler, read_completions  # noqa: E402
from textenv.gym.verifiers_v1 import load_v1_environment, task_rows  # noqa: E402
from tests.verifiers_v1_stub import comparable, textenv_policy, verifiers_own  # noqa: E402

TASKSETS = Path(__file__).parent / "data" / "verifiers_v1"
sys.path.insert(0, str(TASKSETS))


def echo_script(question, results):
    return question.split("final response: ")[-1], None


def echo_tool_script(question, results):
    if not results:
        return "", ("echo_back", {"message": "hello world"})
    return f"<answer>{results[-1]}</answer>", None


def glossary_script(question, results):
    if not results:
        return "Looking it up.", ("facts_lookup", {"name": question.split('look up "')[1].split('"')[0]})
    return f"<answer>{results[-1]}</answer>", None


def echo_user_sim_script(question, results):
    return question, None  # the scripted user's last message, back


SCRIPTS = {"echo-v1": echo_script, "echo-tool-v1": echo_tool_script, "glossary": glossary_script, "echo-user-sim-v1": echo_user_sim_script}


def textenv_own(env, rows, tokenizer, script, **scheduler_kwargs) -> list:
    episodes = GymScheduler(None, tokenizer, policy=textenv_policy(tokenizer, script), verifiers_env=env, **scheduler_kwargs).run(rows)
    assert [episode.errors for episode in episodes] == [[]] * len(rows)
    return episodes


@pytest.mark.parametrize("env_id", sorted(SCRIPTS))
def test_messages_and_rewards_equal_verifiers_own_run(env_id, tokenizer, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(TASKSETS))  # verifiers' tool servers import the taskset (installed, for its users)
    env = load_v1_environment(env_id)
    tasks = list(env.taskset)[:2]
    rows = task_rows(env)[:2]
    theirs = verifiers_own(env, tasks, SCRIPTS[env_id])
    episodes = textenv_own(env, rows, tokenizer, SCRIPTS[env_id])
    ours = [comparable(e.messages, e.final_reward, e.trajectory_infos[-1]["rewards"], e.trajectory_infos[-1]["metrics"]) for e in episodes]
    assert ours == theirs
    assert all(json.loads(episode)[1] == 1.0 for episode in theirs)  # the script solves every task


def test_only_model_turns_are_trained(tokenizer):
    env = load_v1_environment("glossary")
    for episode in textenv_own(env, task_rows(env)[:2], tokenizer, glossary_script, loss_scale="all"):
        question = episode.messages[0]["content"]
        first, call = glossary_script(question, [])
        fact = episode.messages[2]["content"]
        replies = [first + '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (call[0], json.dumps(call[1])), f"<answer>{fact}</answer>"]
        history = episode.history
        assert tokenizer.decode(history.tokens[history.token_masks.bool()]) == "".join(reply + tokenizer.eos_token for reply in replies)
        assert episode.messages[2]["role"] == "tool" and fact in tokenizer.decode(history.tokens)
        assert episode.trajectory_infos[0]["tools"] == ["facts_lookup"]


def test_a_real_model_plays_the_taskset(tiny_model, tokenizer):
    env = load_v1_environment("echo-v1")
    scheduler = GymScheduler(tiny_model, tokenizer, verifiers_env=env, generation_kwargs={"do_sample": True, "max_new_tokens": 8})
    episodes = scheduler.run(task_rows(env), num_generations=2)
    assert len(episodes) == 6 and all(not episode.errors for episode in episodes)
    for episode in episodes:
        info = episode.trajectory_infos[-1]
        assert info["stop_condition"] == "agent_completed" and set(info["rewards"]) == {"echoed"}
        assert episode.final_reward == info["reward"] in (0.0, 1.0)
        generated = episode.history.token_masks.sum().item()
        assert 1 <= generated <= 8 and episode.messages[-1]["role"] == "assistant"


def test_a_malformed_tool_call_is_answered_by_the_harness(tokenizer):
    env = load_v1_environment("glossary")

    def script(question, results):
        return ("", ("facts_lookup", {"name": "Ada Lovelace"})) if len(results) == 1 else (f"<answer>{results[-1]}</answer>", None)

    from textenv.gym import ScriptedPolicy

    def reply(context):
        if "<tool_response>" not in context:
            return '<tool_call>\n{"name": "facts_lookup", "arguments": {"name": \n</tool_call>'  # not JSON
        results = context.count("<tool_response>")
        return '<tool_call>\n{"name": "facts_lookup", "arguments": {"name": "Ada Lovelace"}}\n</tool_call>' if results == 1 else "<answer>the first computer programmer</answer>"

    episode, = GymScheduler(None, tokenizer, policy=ScriptedPolicy(tokenizer, reply), verifiers_env=env).run(task_rows(env)[:1])
    assert not episode.errors
    assert episode.messages[2]["role"] == "tool" and "invalid JSON in tool arguments" in episode.messages[2]["content"]
    assert episode.final_reward == 1.0 and episode.num_turns == 3


def test_an_episode_cut_at_max_length_is_still_scored(tokenizer):
    env = load_v1_environment("glossary")
    rows = task_rows(env)[:1]
    long_reply = "word " * 60
    from textenv.gym import ScriptedPolicy

    def reply(context):
        return long_reply + '<tool_call>\n{"name": "facts_lookup", "arguments": {"name": "Ada Lovelace"}}\n</tool_call>'

    episode, = GymScheduler(None, tokenizer, policy=ScriptedPolicy(tokenizer, reply), verifiers_env=env, max_length=400).run(rows)
    assert not episode.errors and episode.num_turns >= 1
    info = episode.trajectory_infos[-1]
    assert info["rewards"] == {"looked_up": 0.0} and episode.final_reward == 0.0


def test_what_cannot_be_driven_is_refused_with_what_is_missing(tokenizer):
    with pytest.raises(ModuleNotFoundError, match="no-such-taskset.*Install the taskset first"):
        load_v1_environment("no-such-taskset")
    bash = load_v1_environment("echo-v1", {"agent": {"harness": {"id": "bash"}}})
    with pytest.raises(TypeError, match="'bash' harness.*agent.harness.id='null'"):
        GymScheduler(None, tokenizer, policy=textenv_policy(tokenizer, echo_script), verifiers_env=bash)
    sandboxed = load_v1_environment("echo-v1", {"agent": {"runtime": {"type": "prime"}}})
    with pytest.raises(TypeError, match="'prime' runtime, a sandbox service.*agent.runtime.type='subprocess'"):
        GymScheduler(None, tokenizer, policy=textenv_policy(tokenizer, echo_script), verifiers_env=sandboxed)
    with pytest.raises(TypeError, match="runs 2 agents \\(a, b\\); textenv trains one conversation per episode"):
        GymScheduler(None, tokenizer, policy=textenv_policy(tokenizer, echo_script), verifiers_env=load_v1_environment("duet-v1"))
    with pytest.raises(ValueError, match="max_turns=2 with verifiers_env"):
        GymScheduler(None, tokenizer, policy=textenv_policy(tokenizer, echo_script), verifiers_env=load_v1_environment("echo-v1"), max_turns=2)


def test_textenv_rollout_plays_a_v1_taskset(tmp_path):
    output = tmp_path / "completions.jsonl"
    summary = run_command(["rollout", "--model", "tiny", "--task", "verifiers", "--env_id", "echo-v1", "--env_args",
                           '{"taskset": {"phrases": ["ping", "pong"]}}', "--max_new_tokens", "8", "--output", str(output), "--no_progress"])
    assert summary["episodes"] == 2 and summary["errors"] == 0
    records = read_completions(output)
    assert sorted(record["messages"][1]["content"].split(": ")[-1] for record in records) == ["ping", "pong"]  # in the order they ended
    assert all(record["trajectory_infos"][-1]["rewards"].keys() == {"echoed"} for record in records)


def test_train_grpo_on_a_v1_taskset(tmp_path):
    run_command(["train", "--task", "verifiers", "--env_id", "glossary", "--model", "tiny", "--algorithm", "grpo", "--num_generations", "2",
                 "--batch_size", "4", "--mini_batch_size", "4", "--ppo_steps", "1", "--max_new_tokens", "8", "--output_dir", str(tmp_path),
                 "--no_progress"])
    records = read_completions(tmp_path / "completions.jsonl")
    assert len(records) == 4 and all(set(record["trajectory_infos"][-1]["rewards"]) == {"looked_up"} for record in records)
    assert all(record["trajectory_infos"][0]["tools"] == ["facts_lookup"] for record in records)


def test_failures_stay_in_their_episode(tokenizer):
    env = load_v1_environment("faulty-v1", {"agent": {"timeout": {"scoring": 3}}})
    policy = textenv_policy(tokenizer, lambda question, results: (question.split()[-1].rstrip("."), None))
    episodes = GymScheduler(None, tokenizer, policy=policy, verifiers_env=env).run(task_rows(env))
    infos = {episode.messages[-1]["content"]: episode.trajectory_infos[-1] for episode in episodes}
    assert sorted(infos) == ["ok", "reward_hangs", "reward_raises", "run_raises"] and not any(episode.errors for episode in episodes)
    assert infos["ok"]["reward"] == 1.0 and "errors" not in infos["ok"]
    assert infos["reward_raises"]["rewards"] == {"echoed": None} and infos["reward_raises"]["reward"] == 0
    assert infos["reward_raises"]["errors"] == ["TaskError: task FaultyTask scoring: RuntimeError: the grader crashed"]
    assert infos["reward_hangs"]["stop_condition"] == "scoring_timeout" and infos["reward_hangs"]["reward"] == 0
    assert infos["run_raises"]["errors"] == ["EnvError: FaultyEnv.run(): RuntimeError: the game server crashed"]


def test_the_documented_v1_example_runs_as_written():
    import subprocess

    from tests.docs_blocks import example_source

    root = Path(__file__).resolve().parents[1]
    completed = subprocess.run([sys.executable, "-c", example_source("guides/verifiers.md", "<!-- example: verifiers-v1 -->")], cwd=root,
                               capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = [line for line in completed.stdout.splitlines() if " turns -> " in line]
    assert len(lines) == 2 and all("'looked_up'" in line for line in lines)
