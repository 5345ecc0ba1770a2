"""verifiers environments (classic API, verifiers 0.3) run unchanged by `GymScheduler(verifiers_env=...)`:
verifiers' own rollout code and rubric, textenv's engine, tokens and masks.

The equality tests run the same environment twice with the same scripted replies: once through verifiers'
own `Environment.generate` against an OpenAI-compatible stub (verifiers' `OpenAIChatCompletionsClient`
over `httpx.MockTransport`), once through textenv; messages, rewards and metrics must be equal."""

from __future__ import annotations

import asyncio
import json
import re
import textwrap

import pytest

vf = pytest.importorskip("verifiers", reason="the verifiers tests need textenv[verifiers]")
pytest.importorskip("verifiers.legacy", reason="the classic verifiers tests need verifiers 0.3 (textenv[verifiers]); 0.4 has only v1")

from datasets import Dataset  # noqa: E402

from textenv.gym import GymScheduler, ScriptedPolicy, read_completions  # noqa: E402
from textenv.gym.verifiers_envs import load_verifiers_environment  # noqa: E402
from textenv.gym.verifiers_messages import chat_dicts  # noqa: E402
from tests.verifiers_stub import Chooser, rendered, scripted_policy, textenv_own, verifiers_own  # noqa: E402

QUESTIONS = [{"question": "What is 2+3?", "answer": "5"}, {"question": "What is 4+4?", "answer": "8"}]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def answer_parser():
    return vf.XMLParser(["answer"], answer_field="answer")


def exact_answer(parser):
    def correct_answer(completion, answer, **kwargs) -> float:
        return 1.0 if parser.parse_answer(completion) == answer else 0.0

    return correct_answer


def single_turn_env(**kwargs):
    parser = answer_parser()
    rubric = vf.Rubric(funcs=[exact_answer(parser), parser.get_format_reward_func()], weights=[1.0, 0.2], parser=parser)
    few_shot = [{"role": "user", "content": "What is one plus one?"}, {"role": "assistant", "content": "<answer>2</answer>"}]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(QUESTIONS), system_prompt="Answer in <answer></answer> tags.", few_shot=few_shot,
                            parser=parser, rubric=rubric, **kwargs)


def tool_env(**kwargs):
    parser = answer_parser()
    return vf.ToolEnv(dataset=Dataset.from_list(QUESTIONS), tools=[add], max_turns=3, parser=parser,
                      rubric=vf.Rubric(funcs=[exact_answer(parser)], parser=parser), **kwargs)


class GuessEnv(vf.MultiTurnEnv):
    """A number-guessing game: the environment answers each guess with higher / lower, and stops on a hit."""

    async def setup_state(self, state):
        state["target"] = int(state["answer"])
        state["guesses"] = 0
        return state

    async def env_response(self, messages, state, **kwargs):
        state["guesses"] += 1
        guess = int(re.findall(r"-?\d+", messages[-1].content or "0")[-1])
        if guess == state["target"]:
            state["solved"] = True
            return [{"role": "user", "content": "Correct!"}]
        return [{"role": "user", "content": "higher" if guess < state["target"] else "lower"}]

    @vf.stop
    async def solved(self, state) -> bool:
        return state.get("solved", False)


def guess_env(group_bonus: bool = True):
    async def solved_reward(state) -> float:
        return 1.0 if state.get("solved") else 0.0

    async def fewest_guesses(states) -> list:  # a group function: the quickest solver of the group gets 1
        best = min(state["guesses"] for state in states)
        return [1.0 if state["guesses"] == best else 0.0 for state in states]

    funcs = [solved_reward, fewest_guesses] if group_bonus else [solved_reward]
    rows = [{"question": "Guess my number (1-10).", "answer": "7"}, {"question": "Guess my number (1-10).", "answer": "3"}]
    return GuessEnv(dataset=Dataset.from_list(rows), max_turns=4, rubric=vf.Rubric(funcs=funcs, weights=[1.0, 0.5][: len(funcs)]))


# ---------------------------------------------------------------- the scripts both sides play
def is_question(text: str) -> bool:
    return text.startswith(("What is 2", "What is 4", "Guess"))


def tool_script(question: str, choice: int, turn: int):
    """A call of `add` first (choice 1 adds one too many), then the answer the tool gave."""
    a, b = (int(x) for x in re.findall(r"\d+", question)[:2])
    if turn == 0:
        return "Let me add.", ("add", {"a": a, "b": b + choice})
    return f"<answer>{a + b + choice}</answer>", None


def answer_script(question: str, choice: int, turn: int):
    a, b = (int(x) for x in re.findall(r"\d+", question)[:2])
    return (f"<answer>{a + b}</answer>" if choice == 0 else f"I think {a + b + 1}"), None


def guess_script(question: str, choice: int, turn: int):
    guesses = [[5, 7, 3, 1], [3, 6, 7, 3]][choice]
    return f"My guess is {guesses[turn]}", None


@pytest.mark.parametrize("make_env, script", [
    (single_turn_env, answer_script),
    (tool_env, tool_script),
    (guess_env, guess_script),
], ids=["single_turn", "tool_env", "multi_turn_group_reward"])
def test_equal_to_verifiers_own_rollout(tokenizer, make_env, script):
    env = make_env()
    expected = verifiers_own(env, env.get_dataset(), script, 2, is_question)
    env = make_env()
    got = textenv_own(env, env.get_dataset(), tokenizer, script, 2, is_question)
    assert got == expected
    assert len({reward for _, reward in got}) > 1  # the scripts' choices score differently: the comparison can fail


def test_single_turn_environment_uses_prompt_rubric_and_metrics(tokenizer, tmp_path):
    env = single_turn_env()
    policy = ScriptedPolicy(tokenizer, lambda context: "<answer>5</answer>" if "2+3" in context else "<answer>9</answer>")
    scheduler = GymScheduler(None, tokenizer, policy=policy, verifiers_env=env, loss_scale="all")
    episodes = scheduler.run(env.get_dataset(), completions_path=tmp_path / "completions.jsonl")
    assert [episode.messages[:3] for episode in episodes] == [[
        {"role": "system", "content": "Answer in <answer></answer> tags."},
        {"role": "user", "content": "What is one plus one?"},
        {"role": "assistant", "content": "<answer>2</answer>"},
    ]] * 2
    assert [episode.total_reward for episode in episodes] == pytest.approx([1.2, 0.2])
    metrics = [episode.trajectory_infos[-1]["metrics"] for episode in episodes]
    assert metrics[0]["correct_answer"] == 1.0 and metrics[1]["correct_answer"] == 0.0
    assert all(episode.finish_reason == "done" and not episode.errors for episode in episodes)
    records = read_completions(tmp_path / "completions.jsonl")
    assert [record["final_reward"] for record in records] == pytest.approx([1.2, 0.2])
    assert records[0]["trajectory_infos"][-1]["stop_condition"] == "max_turns_reached"


# ---------------------------------------------------------------- StatefulToolEnv: arguments injected from the state
class Notebook(vf.StatefulToolEnv):
    """A tool that writes into the episode's own notebook: `notebook_id` is injected from the state, hidden from the model."""

    def __init__(self, **kwargs):
        super().__init__(tools=[], max_turns=3, **kwargs)
        self.add_tool(self.write, args_to_skip=["notebook_id"])
        self.notebooks: dict = {}

    def write(self, text: str, notebook_id: str) -> str:
        """Write a line into the notebook.

        Args:
            text: The line to write.
            notebook_id: The episode's notebook (injected).
        """
        self.notebooks.setdefault(notebook_id, []).append(text)
        return f"{len(self.notebooks[notebook_id])} lines"

    async def setup_state(self, state):
        state["notebook_id"] = state["trajectory_id"]
        return state

    def update_tool_args(self, tool_name, tool_args, messages, state, **kwargs):
        return {**tool_args, "notebook_id": state["notebook_id"]} if tool_name == "write" else tool_args


def notebook_env():
    async def lines_written(state) -> float:
        return float(len(env.notebooks.get(state["notebook_id"], [])))

    env = Notebook(dataset=Dataset.from_list(QUESTIONS), rubric=vf.Rubric(funcs=[lines_written]))
    return env


def notebook_script(question: str, choice: int, turn: int):
    return ("", ("write", {"text": f"choice {choice}, line {turn}"})) if turn < 1 + choice else ("Done.", None)


def test_stateful_tool_env_injects_state_arguments_and_hides_them(tokenizer):
    env = notebook_env()
    assert [tool.name for tool in env.tool_defs] == ["write"] and "notebook_id" not in json.dumps(env.tool_defs[0].parameters)
    got = textenv_own(env, env.get_dataset(), tokenizer, notebook_script, 2, is_question)
    fresh = notebook_env()
    assert got == verifiers_own(fresh, fresh.get_dataset(), notebook_script, 2, is_question)
    rewards = sorted(json.loads(reward)[0] for _, reward in got)
    assert rewards == [1.0, 1.0, 2.0, 2.0]  # each episode wrote into its own notebook


# ---------------------------------------------------------------- exact tokens and masks
def test_only_model_turns_are_trained(tokenizer):
    env = tool_env()
    policy = scripted_policy(tokenizer, Chooser(tool_script, 1), is_question)
    episodes = GymScheduler(None, tokenizer, policy=policy, verifiers_env=env, loss_scale="all").run(env.get_dataset())
    for episode in episodes:
        question = episode.messages[0]["content"]
        replies = [rendered(*tool_script(question, 0, turn)) for turn in range(2)]
        history = episode.history
        assert tokenizer.decode(history.tokens[history.token_masks.bool()]) == "".join(reply + tokenizer.eos_token for reply in replies)
        assert episode.messages[2]["role"] == "tool" and episode.messages[2]["content"] in tokenizer.decode(history.tokens)


# ---------------------------------------------------------------- failures end one episode, never the batch
class FlakyGuessEnv(GuessEnv):
    """Raises in `env_response` for the target 3, hangs for the target 7 when told to."""

    hang = False

    async def env_response(self, messages, state, **kwargs):
        if state["target"] == 3:
            raise RuntimeError("the game server crashed")
        if self.hang:
            await asyncio.sleep(30)
        return await super().env_response(messages, state, **kwargs)


def flaky_env(hang: bool = False):
    env = FlakyGuessEnv(dataset=guess_env().get_dataset(), max_turns=4, rubric=vf.Rubric(funcs=[lambda state: 1.0]))
    env.hang = hang
    return env


def test_env_response_that_raises_ends_its_episode_only(tokenizer, tmp_path):
    env = flaky_env()
    policy = scripted_policy(tokenizer, Chooser(guess_script, 1), is_question)
    episodes = GymScheduler(None, tokenizer, policy=policy, verifiers_env=env).run(env.get_dataset(), completions_path=tmp_path / "c.jsonl")
    crashed, fine = sorted(episodes, key=lambda episode: not episode.errors)
    assert crashed.errors[0]["stage"] == "step" and "the game server crashed" in crashed.errors[0]["message"]
    assert crashed.final_reward is None and not crashed.trainable
    assert fine.errors == [] and fine.final_reward == 1.0 and fine.trajectory_infos[-1]["stop_condition"] == "solved"
    assert [record["error"] is not None for record in read_completions(tmp_path / "c.jsonl")] == [True, False]


def test_env_response_that_hangs_times_out(tokenizer):
    env = flaky_env(hang=True)
    policy = scripted_policy(tokenizer, Chooser(guess_script, 1), is_question)
    scheduler = GymScheduler(None, tokenizer, policy=policy, verifiers_env=env, step_timeout=0.5)
    episodes = scheduler.run(env.get_dataset())
    assert sorted(episode.errors[0]["type"] for episode in episodes) == ["EnvTimeoutError", "RuntimeError"]
    assert scheduler.stats.envs_closed == 2


def test_reward_function_that_raises_scores_zero_and_is_recorded(tokenizer):
    def broken(completion) -> float:
        raise ValueError("judge unavailable")

    env = single_turn_env()
    env.rubric.add_reward_func(broken, weight=1.0)
    policy = ScriptedPolicy(tokenizer, lambda context: "<answer>5</answer>")
    episodes = GymScheduler(None, tokenizer, policy=policy, verifiers_env=env).run(env.get_dataset())
    info = episodes[0].trajectory_infos[-1]
    assert info["metrics"]["broken"] == 0.0 and episodes[0].final_reward == pytest.approx(1.2)  # verifiers scores it 0
    assert any("broken" in message and "judge unavailable" in message for message in info["scoring_errors"])


def test_scoring_that_hangs_is_an_error_of_its_group(tokenizer):
    async def slow(completion) -> float:
        await asyncio.sleep(30)
        return 1.0

    env = vf.SingleTurnEnv(dataset=Dataset.from_list(QUESTIONS), rubric=vf.Rubric(funcs=[slow]))
    policy = ScriptedPolicy(tokenizer, lambda context: "5")
    episodes = GymScheduler(None, tokenizer, policy=policy, verifiers_env=env, step_timeout=0.5).run(env.get_dataset(), num_generations=2)
    assert [episode.errors[0]["stage"] for episode in episodes] == ["score"] * 4
    assert all("scoring did not end" in episode.errors[0]["message"] for episode in episodes)


def test_malformed_tool_call_is_answered_by_the_environment(tokenizer):
    env = tool_env()
    def reply(context: str) -> str:
        return "<answer>5</answer>" if "<tool_response>" in context else '<tool_call>\n{"name": "add", "arguments": {"a": 2,\n</tool_call>'

    episodes = GymScheduler(None, tokenizer, policy=ScriptedPolicy(tokenizer, reply), verifiers_env=env).run(env.get_dataset())
    for episode in episodes:
        call_message, answer = episode.messages[1], episode.messages[2]
        assert call_message["tool_calls"][0]["error"] and answer["role"] == "tool" and "Expecting" in answer["content"]
        assert episode.errors == [] and episode.num_turns == 2


def test_max_length_is_verifiers_prompt_too_long(tokenizer):
    env = guess_env(group_bonus=False)
    policy = scripted_policy(tokenizer, Chooser(guess_script, 1), is_question)
    episodes = GymScheduler(None, tokenizer, policy=policy, verifiers_env=env, max_length=40).run(env.get_dataset())
    for episode in episodes:
        assert episode.finish_reason == "max_length" and episode.errors == []
        info = episode.trajectory_infos[-1]
        assert info["stop_condition"] == "prompt_too_long" and info["is_truncated"] is True and episode.final_reward is not None


# ---------------------------------------------------------------- what is refused, and how
def test_environment_not_installed_names_the_install_commands():
    with pytest.raises(ModuleNotFoundError, match=r"no module 'no_such_env_xyz' is installed.*prime env install.*vf-install"):
        load_verifiers_environment("no-such-env-xyz")


def test_environment_that_cannot_reach_its_service_fails_at_load(tmp_path, monkeypatch):
    (tmp_path / "needs_service.py").write_text(textwrap.dedent('''
        import socket
        def load_environment(url="127.0.0.1", port=9):
            socket.create_connection((url, port), timeout=1).close()
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError, match=r"Failed to load environment 'needs-service'.*(refused|Connection)"):
        load_verifiers_environment("needs-service")


def test_refusals_name_the_fix(tokenizer):
    policy = ScriptedPolicy(tokenizer, lambda context: "")
    with pytest.raises(ValueError, match=r"max_turns=2 with verifiers_env.*vf.load_environment\(ID, max_turns=N\)"):
        GymScheduler(None, tokenizer, policy=policy, verifiers_env=single_turn_env(), max_turns=2)
    with pytest.raises(ValueError, match="give one of gym_env, environment_factory and verifiers_env"):
        GymScheduler(None, tokenizer, policy=policy, verifiers_env=single_turn_env(), gym_env="x")
    with pytest.warns(Warning):
        completion_env = single_turn_env(message_type="completion")
    with pytest.raises(ValueError, match="message_type='completion'.*chat"):
        GymScheduler(None, tokenizer, policy=policy, verifiers_env=completion_env)
    with pytest.raises(TypeError, match="expected a verifiers Environment"):
        GymScheduler(None, tokenizer, policy=policy, verifiers_env=object())


def test_verifiers_v1_environment_is_refused_with_what_is_missing(tokenizer):
    from verifiers.v1.env import Env as V1Env

    class V1Taskset(V1Env):
        pass

    V1Taskset.__abstractmethods__ = frozenset()
    with pytest.raises(TypeError, match=r"verifiers v1 environment; textenv drives v1 tasksets with verifiers 0\.4\.0.*verifiers 0\.3\.1 is installed"):
        GymScheduler(None, tokenizer, policy=ScriptedPolicy(tokenizer, lambda context: ""), verifiers_env=object.__new__(V1Taskset))


def test_rows_without_prompt_say_which_rows_to_pass(tokenizer):
    env = single_turn_env()
    episodes = GymScheduler(None, tokenizer, policy=ScriptedPolicy(tokenizer, lambda context: ""), verifiers_env=env).run(QUESTIONS)
    assert all("pass the rows verifiers formats (environment.get_dataset()" in episode.errors[0]["message"] for episode in episodes)


class ForgetfulGuessEnv(GuessEnv):
    """Rewrites the history each turn (keeps only the opening and the last hint): not one growing conversation."""

    async def get_prompt_messages(self, state):
        messages = await super().get_prompt_messages(state)
        return messages if not state["trajectory"] else [*state["prompt"], messages[-1]]


def test_environment_that_rewrites_the_history_fails_its_episode_with_the_reason(tokenizer):
    env = ForgetfulGuessEnv(dataset=guess_env().get_dataset(), max_turns=4, rubric=vf.Rubric(funcs=[lambda state: 1.0]))
    policy = scripted_policy(tokenizer, Chooser(guess_script, 1), is_question)
    episodes = GymScheduler(None, tokenizer, policy=policy, verifiers_env=env).run(env.get_dataset())
    for episode in episodes:
        assert episode.errors[0]["stage"] == "step" and "does not extend the conversation" in episode.errors[0]["message"]
        assert episode.num_turns == 1

