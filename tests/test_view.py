"""`textenv view` without a browser: episode records (segments exactly as `show_text` colours them, tokens as
`show_tokens` colours them, tool calls), `RunRecorder` and `train(run_dir=...)`, reading run directories,
the page's HTML and embedded JSON, `show()` for notebooks (the command: `test_view_command.py`). The runs are real: the tiny
random model trained for 2 PPO steps on the calculator `TextEnvironment` (some turns scripted so that tools
are called, fail and are answered) and on Gym `tool_env` rows with a scripted policy. `test_view_browser.py`
loads their pages in Chromium."""

from __future__ import annotations

import dataclasses
import html
import json
import re
from pathlib import Path

import pytest
import torch

from textenv.environment import TextHistory
from textenv.environment.rendering import text_view, tokens_view
from textenv.gym import GymEpisode, GymScheduler, GymSource, ScriptedPolicy, read_completions
from textenv.gym.completions import CompletionsLog
from textenv.gym.play import completion_record
from textenv.tasks.calculator import PROMPT
from textenv.tools.base import call_tool
from textenv.tools.calculator import Calculator
from textenv.training import (
    Settings,
    StepLog,
    TextEnvironmentSource,
    build_calculator_environment,
    build_policy,
    build_trainer,
    calculator_task_batches,
    calculator_tasks,
    evaluate,
    train,
)
from textenv.training.sources import EpisodeBatch
from textenv.view import RunRecorder, build_page, episode_record, load_run, set_aside_previous_run, show, step_summary
from textenv.view.episodes import gym_tool_calls, message_segments
from textenv.view.page import COLOUR_ATTRIBUTES, script_json, segment_colours

TINY = Settings(
    model="tiny", ppo_steps=2, batch_size=6, mini_batch_size=3, learning_rate=1e-3, lora_layers=1,
    max_new_tokens=4, max_turns=2, generation_batch_size=6,
)
# Each episode of the calculator run follows one script (in turn): its model turns, as functions of the
# task's expression, or None for the tiny model's own sampled turn.
SCRIPTS = [
    [lambda e: f"<request><Calculator>{e}<call>", lambda e: f"Result={call_tool(Calculator(), e)}<submit>"],  # reward 1
    [lambda e: "Result=12345<submit>"],  # wrong, no tool
    [lambda e: f"<request><Search>{e}<call>", lambda e: f"Result={call_tool(Calculator(), e)}<submit>"],  # unknown tool
    [None],  # the tiny model
    [lambda e: "<request><Calculator>2+<call>", None],  # a tool error
    [lambda e: f"<request><Calculator>{e}<call>", lambda e: "<request><Calculator>1+1<call>"],  # truncated
]
GYM_ROWS = [
    {"query": "What is 2+3?", "answer": "5", "env_config": {"name": "tool_env"}},
    {"env_config": {"name": "tool_env"}},  # no query: its reset fails (logged in completions.jsonl only)
    {"query": "What is 6*7?", "answer": "42", "env_config": {"name": "tool_env"}},
]
_RUNS: dict = {}


class ScriptedTurns:
    """Replaces `env.generate` (lockstep turns): each new episode takes the next script of `SCRIPTS`."""

    def __init__(self, env):
        self.env, self.scripts, self.started = env, {}, 0

    def __call__(self, histories):
        sampled = []
        for history in [history for history in histories if not history.completed]:
            if id(history) not in self.scripts:
                self.scripts[id(history)] = [*SCRIPTS[self.started % len(SCRIPTS)]]
                self.started += 1
            turns = self.scripts[id(history)]
            turn = turns.pop(0) if turns else None
            if turn is None:
                sampled.append(history)
                continue
            text = turn(re.search(r"What is (.+?)\?", history.text[len(PROMPT):]).group(1))
            history.append_segment(text, self.env.tokenizer(text, add_special_tokens=False).input_ids, system=False)
        if sampled:
            type(self.env).generate(self.env, sampled)
        return histories


def gym_reply(context: str) -> str:
    """Call the calculator on the question, then answer (right for 2+3 only)."""
    expression = re.search(r"What is (.+?)\?", context).group(1)
    if context.count("<|im_start|>assistant") < 2:
        return f"<request><Calculator>{expression}<call>"
    return ("5" if expression == "2+3" else "0") + "<submit>"


def build_runs(base: Path) -> dict:
    """The calculator run (with an evaluation after it) and the Gym run, each trained 2 steps with `run_dir`."""
    if _RUNS:
        return _RUNS
    torch.manual_seed(0)
    model, tokenizer = build_policy(TINY)
    trainer = build_trainer(model, tokenizer, TINY)
    env = build_calculator_environment(model, tokenizer, TINY)
    env.generate, env.turn_order = ScriptedTurns(env), "lockstep"
    text_dir = base / "calculator"
    logs = train(trainer, TextEnvironmentSource(env, calculator_task_batches(TINY.batch_size, seed=0)), 2, progress=False, run_dir=text_dir)
    queries, answers = calculator_tasks(3, seed=5, settings=TINY)
    evaluation = evaluate(env, queries, answers, sample=False)
    with RunRecorder(text_dir, tokenizer=tokenizer) as recorder:
        recorder.record_episodes(evaluation.histories, evaluation.rewards, step=2, phase="eval-after")

    model, tokenizer = build_policy(TINY)
    gym_trainer = build_trainer(model, tokenizer, dataclasses.replace(TINY, batch_size=2, mini_batch_size=1))
    scheduler = GymScheduler(model, tokenizer, max_turns=3, loss_scale="default", policy=ScriptedPolicy(tokenizer, gym_reply))
    gym_dir = base / "gym"
    source = GymSource(scheduler, GYM_ROWS, 2, completions_path=gym_dir / "completions.jsonl")
    gym_logs = train(gym_trainer, source, 2, progress=False, run_dir=gym_dir)
    _RUNS.update(text=text_dir, logs=logs, evaluation=evaluation, tokenizer=tokenizer, gym=gym_dir, gym_logs=gym_logs)
    return _RUNS


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return build_runs(tmp_path_factory.getbasetemp() / "view_runs")


def expected_episodes(run_dir: Path) -> list:
    """The episodes a run directory's page lists, computed here from the JSONL files alone."""
    records = read_completions(run_dir / "episodes.jsonl") if (run_dir / "episodes.jsonl").exists() else []
    known = {record.get("trajectory_id") for record in records}
    lines = read_completions(run_dir / "completions.jsonl") if (run_dir / "completions.jsonl").exists() else []
    return records + [line for line in lines if line["trajectory_id"] not in known]


def hand_history() -> TextHistory:
    """prompt, a Calculator call, its response, an unknown tool call, its response, a tool error, the answer."""
    history = TextHistory("Q: 2+3?\n", [1, 2, 3])
    for text, system in [
        ("<request><Calculator>2+3<call>", False), ("5<response>", True),
        ("<request><Search>x<call>", False), ("Unknown tool Search.<response>", True),
        ("<request><Calculator>2+<call>", False), ("Tool error: invalid expression<response>", True),
        ("Result=5<submit>", False),
    ]:
        history.append_segment(text, torch.arange(10, 10 + len(text) // 4 + 1), system=system)
    history.reward = 1.0
    history.complete()
    return history


# ------------------------------------------------------------------------------------------------ episode records
def test_segments_are_coloured_exactly_as_show_text_colours_them():
    history = hand_history()
    record = episode_record(history, step=3, phase="eval")
    style_kind = {getattr(TextHistory, attribute): kind for kind, attribute in COLOUR_ATTRIBUTES.items()}
    view = text_view(history)
    coloured = [(style_kind[str(span.style)], view.plain[span.start:span.end]) for span in view.spans if span.end <= len(history.text)]
    assert [(s["kind"], s["text"]) for s in record["segments"]] == coloured
    assert [s["kind"] for s in record["segments"]] == ["prompt", "model", "tool", "model", "tool", "model", "tool", "model"]
    reward_span = view.spans[-1]
    assert style_kind[str(reward_span.style)] == "reward" and view.plain[reward_span.start:].strip() == "Reward: 1.0"
    assert record["reward"] == 1.0 and record["step"] == 3 and record["phase"] == "eval" and record["finish_reason"] == "submit"


def test_token_kinds_are_the_ones_show_tokens_colours(tokenizer):
    history = hand_history()
    tokens = episode_record(history, 0, "train", tokenizer=tokenizer)["tokens"]
    assert tokens["ids"] == history.tokens.tolist() and tokens["mask"] == history.token_masks.tolist()
    assert tokens["text"] == tokenizer.convert_ids_to_tokens(history.tokens.tolist()) and tokens["prompt_length"] == 3
    # the page's rule: the prompt's tokens, then model (mask 1) or tool (mask 0)
    kinds = ["prompt" if i < tokens["prompt_length"] else ("model" if m else "tool") for i, m in enumerate(tokens["mask"])]
    style_kind = {getattr(TextHistory, attribute): kind for kind, attribute in COLOUR_ATTRIBUTES.items()}
    spans = [span for span in tokens_view(history, tokenizer).spans if style_kind[str(span.style)] != "reward"]
    assert [style_kind[str(span.style)] for span in spans] == kinds
    assert episode_record(history, 0, "train")["tokens"]["text"] == []  # no tokenizer: ids and mask only


def test_tag_tool_calls_with_their_responses_and_errors():
    calls = episode_record(hand_history(), 0, "train")["tool_calls"]
    assert calls == [
        {"name": "Calculator", "query": "2+3", "response": "5", "error": False},
        {"name": "Search", "query": "x", "response": "Unknown tool Search.", "error": True},
        {"name": "Calculator", "query": "2+", "response": "Tool error: invalid expression", "error": True},
    ]
    assert step_summary([episode_record(hand_history(), 0, "train")]) == {
        "reward_mean": 1.0, "accuracy": 1.0, "episodes": 1, "tool_calls": 3, "tool_errors": 2, "tool_calls_by_name": {"Calculator": 2, "Search": 1},
        "tool_calls_cut": 0,
    }


def test_json_tool_calls_of_a_history_and_of_gym_step_infos():
    history = TextHistory("prompt", [1, 2])
    history.append_segment("call", [3], system=False)
    history.info = {"tool_calls": [{"id": "call00000", "name": "Calculator", "arguments": {"query": "1+1"}, "result": "2", "error": None}], "finish_reason": "answered"}
    record = episode_record(history, 0, "train")
    assert record["tool_calls"] == [{"name": "Calculator", "arguments": {"query": "1+1"}, "response": "2", "error": False}]
    assert record["finish_reason"] == "answered"
    messages = [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "Calculator", "arguments": {"query": "1+"}}}]},
        {"role": "tool", "content": "Tool error: bad"}, {"role": "assistant", "content": "<request><Nope>x<call>"},
        {"role": "user", "content": "Unknown tool Nope."}, {"role": "assistant", "content": "2"},
    ]
    infos = [{}, {"tool_calls": [{"name": "Calculator", "arguments": {"query": "1+"}, "result": "Tool error: bad", "error": "bad"}]}, {"tool": "Nope", "query": "x", "error": "unknown tool"}, {"correct": True}]
    assert [s["kind"] for s in message_segments(messages)] == ["prompt", "prompt", "model", "tool", "model", "tool", "model"]
    assert message_segments(messages)[2]["text"] == '\n{"name": "Calculator", "arguments": {"query": "1+"}}'
    assert gym_tool_calls(messages, infos) == [
        {"name": "Calculator", "arguments": {"query": "1+"}, "response": "Tool error: bad", "error": True},
        {"name": "Nope", "query": "x", "response": "Unknown tool Nope.", "error": True},
    ]


# ------------------------------------------------------------------------------------------------ the runs
def test_train_with_run_dir_writes_every_episode_and_step(runs):
    records = [r for r in read_completions(runs["text"] / "episodes.jsonl") if r["phase"] == "train"]
    steps = read_completions(runs["text"] / "steps.jsonl")
    logs = runs["logs"]
    assert len(records) == TINY.batch_size * len(logs) and [line["step"] for line in steps] == [0, 1]
    for log, line in zip(logs, steps):
        mine = [r for r in records if r["step"] == log.step]
        histories = log.batch.episodes
        assert [r["tokens"]["ids"] for r in mine] == [h.tokens.tolist() for h in histories]
        assert [r["segments"] for r in mine] == [episode_record(h, log.step, "train")["segments"] for h in histories]
        assert [r["reward"] for r in mine] == [float(s) for s in log.batch.scores]
        assert line["kl"] == log.kl and line["reward_mean"] == pytest.approx(log.reward_mean)
        assert line["accuracy"] == sum(float(s) >= 1.0 for s in log.batch.scores) / len(mine)
        assert line["tool_calls"] == sum(len(r["tool_calls"]) for r in mine) == 5  # scripts: 1 + 0 + 1 + 0 + 1 + 2
        assert line["tool_errors"] == 2 and line["tool_calls_by_name"] == {"Calculator": 4, "Search": 1}
        assert line["episodes"] == TINY.batch_size and line["episode_seconds"] > 0 and line["ppo_seconds"] > 0
    finishes = {r["finish_reason"] for r in records}
    assert {"submit", "truncated"} <= finishes


def test_evaluation_episodes_are_recorded_with_their_phase(runs):
    evaluation = [r for r in read_completions(runs["text"] / "episodes.jsonl") if r["phase"] == "eval-after"]
    assert [r["reward"] for r in evaluation] == runs["evaluation"].rewards and {r["step"] for r in evaluation} == {2}
    assert [r["tokens"]["ids"] for r in evaluation] == [h.tokens.tolist() for h in runs["evaluation"].histories]


def test_a_gym_run_directory_adds_the_failed_episodes_of_completions_jsonl(runs):
    run = load_run(runs["gym"])
    trained = read_completions(runs["gym"] / "episodes.jsonl")
    assert len(trained) == 4 and all(r["tokens"] and r["trajectory_id"] for r in trained)
    assert [r["trajectory_id"] for r in run.episodes] == [r["trajectory_id"] for r in expected_episodes(runs["gym"])]
    failed = [r for r in run.episodes if r["phase"] == "rollout"]
    assert len(failed) == 2 and all(r["error"].startswith("reset: KeyError") and r["tokens"] is None for r in failed)
    correct = next(r for r in trained if r["reward"] == 1.0)
    assert [s["kind"] for s in correct["segments"]] == ["prompt", "prompt", "model", "tool", "model"]
    assert correct["tool_calls"] == [{"name": "Calculator", "query": "2+3", "response": "5", "error": False}]
    assert [line["step"] for line in run.steps] == [0, 1] and run.steps[0]["kl"] == runs["gym_logs"][0].kl


def test_a_bare_completions_file_is_read_and_summarised_per_step(runs):
    run = load_run(runs["gym"] / "completions.jsonl")
    assert len(run.episodes) == 6 and {r["phase"] for r in run.episodes} == {"rollout"}
    assert [line["step"] for line in run.steps] == [0, 1] and [line["episodes"] for line in run.steps] == [3, 3]
    assert run.steps[0]["tool_calls"] == 2 and run.steps[0]["kl"] is None


def test_a_torn_last_line_is_skipped(tmp_path, runs):
    for name in ("episodes.jsonl", "steps.jsonl"):
        (tmp_path / name).write_bytes((runs["text"] / name).read_bytes() + b'{"step": 9, "phase": "tr')
    run = load_run(tmp_path)
    assert len(run.episodes) == len(read_completions(runs["text"] / "episodes.jsonl")) and [s["step"] for s in run.steps] == [0, 1]


def test_a_resumed_run_keeps_the_last_attempt_of_each_step(tmp_path):
    def step_log(step: int, reward: float) -> StepLog:
        history = hand_history()
        batch = EpisodeBatch([], [], [torch.tensor(reward)], [], [""], [""], episodes=[history])
        return StepLog(step, reward, 0.5, 0.1, 1.0, 1.0, {}, batch)

    with RunRecorder(tmp_path) as first:
        first.record_step(step_log(0, 1.0))
        first.record_step(step_log(1, 0.0))  # then a crash, and a resume from step 1
    with RunRecorder(tmp_path) as second:
        second.record_step(step_log(1, 1.0))
    run = load_run(tmp_path)
    assert [(r["step"], r["reward"], r["run"]) for r in run.episodes] == [(0, 1.0, first.run_id), (1, 1.0, second.run_id)]
    assert [(s["step"], s["reward_mean"]) for s in run.steps] == [(0, 1.0), (1, 1.0)]
    with pytest.raises(ValueError, match="one reward per episode"):
        second.record_episodes([hand_history()], rewards=[1.0, 0.0])


def test_a_resumed_gym_run_drops_the_stale_attempt_also_from_completions(tmp_path, runs):
    for name in ("episodes.jsonl", "steps.jsonl", "completions.jsonl"):
        (tmp_path / name).write_bytes((runs["gym"] / name).read_bytes())
    episode = GymEpisode(row_index=0, trajectory_id="resumed-1", messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "5"}],
                         total_reward=1.0, finish_reason="done", step=1)
    with CompletionsLog(tmp_path / "completions.jsonl") as log:
        log.write(completion_record(episode))
    with RunRecorder(tmp_path) as resumed:
        resumed.record_step(StepLog(1, 1.0, 0.0, 0.1, 1.0, 1.0, {}, EpisodeBatch([], [], [torch.tensor(1.0)], [], [""], [""], episodes=[episode])))
    run = load_run(tmp_path)
    assert [(r["step"], r["phase"], r["trajectory_id"]) for r in run.episodes if r["phase"] == "train"] == [
        *[(0, "train", r["trajectory_id"]) for r in read_completions(runs["gym"] / "episodes.jsonl") if r["step"] == 0], (1, "train", "resumed-1"),
    ]
    assert len([r for r in run.episodes if r["phase"] == "rollout"]) == 2  # the failed episodes only, not the stale trained ones
    assert [s["run"] for s in run.steps] == [read_completions(runs["gym"] / "steps.jsonl")[0]["run"], resumed.run_id]


def test_a_new_run_sets_the_previous_runs_files_aside(tmp_path, runs):
    assert set_aside_previous_run(tmp_path / "empty") is None
    for name in ("episodes.jsonl", "steps.jsonl", "completions.jsonl"):
        (tmp_path / name).write_bytes((runs["gym"] / name).read_bytes())
    (tmp_path / "reward_curve.png").write_bytes(b"png")
    first = set_aside_previous_run(tmp_path)
    assert sorted(path.name for path in first.iterdir()) == ["completions.jsonl", "episodes.jsonl", "steps.jsonl"]
    assert (first / "episodes.jsonl").read_bytes() == (runs["gym"] / "episodes.jsonl").read_bytes()  # nothing lost
    assert (tmp_path / "reward_curve.png").exists() and not (tmp_path / "episodes.jsonl").exists()
    (tmp_path / "steps.jsonl").write_bytes((runs["gym"] / "steps.jsonl").read_bytes())
    second = set_aside_previous_run(tmp_path)  # within the same second: a folder of its own
    assert second != first and [path.name for path in second.iterdir()] == ["steps.jsonl"]
    assert len(list((tmp_path / "previous").iterdir())) == 2


def test_train_without_run_dir_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, tokenizer = build_policy(TINY)
    env = build_calculator_environment(model, tokenizer, TINY)
    train(build_trainer(model, tokenizer, TINY), TextEnvironmentSource(env, calculator_task_batches(6, seed=0)), 1, progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", ["missing", "empty", "unrelated"])
def test_clear_errors_for_a_path_without_episodes(tmp_path, case):
    if case == "missing":
        with pytest.raises(FileNotFoundError, match=r"path '.*nowhere' does not exist; pass a run directory"):
            load_run(tmp_path / "nowhere")
    elif case == "empty":
        with pytest.raises(FileNotFoundError, match="holds none of episodes.jsonl, steps.jsonl, completions.jsonl; pass a run directory"):
            load_run(tmp_path)
    else:
        (tmp_path / "rows.jsonl").write_text('{"problem": "What is 2+2?"}\n')
        with pytest.raises(ValueError, match="holds no episodes"):
            load_run(tmp_path / "rows.jsonl")


# ------------------------------------------------------------------------------------------------ the page
def embedded_data(page: str):
    blocks = re.findall(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.DOTALL)
    assert len(blocks) == 1
    return blocks[0], json.loads(blocks[0])


def test_the_page_is_self_contained_and_embeds_the_episodes_safely(tmp_path, runs):
    evil = "</script><!--<script>alert(1)</script>&amp; <request><Calculator>1<call>"
    history = hand_history()
    history.append_segment(evil, [7], system=True)
    with RunRecorder(tmp_path) as recorder:
        recorder.record_episodes([history], [float("nan")], step=0, phase="eval")
    page = build_page(tmp_path, title="<b>my run</b>")
    block, data = embedded_data(page)
    assert "<" not in block and ">" not in block and "&" not in block
    assert data["episodes"][0]["segments"][-1]["text"] == evil and data["episodes"][0]["reward"] is None
    assert page.count("</script>") == 2 and "<title>&lt;b&gt;my run&lt;/b&gt;</title>" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing loaded from elsewhere
    assert json.loads(script_json({"a": "\u2028</x>"})) == {"a": "\u2028</x>"}


def test_the_page_carries_show_text_colours(runs):
    page = build_page(runs["text"])
    for kind, colours in segment_colours().items():
        assert f".kind-{kind} {{ color: {colours['color']}; background-color: {colours['background']}; }}" in page
    assert segment_colours()["model"]["background"] == "#00afff"  # rich's deep_sky_blue1
    _, data = embedded_data(page)
    assert len(data["episodes"]) == len(expected_episodes(runs["text"])) and [s["step"] for s in data["steps"]] == [0, 1]


def test_show_returns_an_iframe_holding_the_page(runs):
    view = show(runs["text"], title="notebook")
    snippet = view._repr_html_()
    match = re.fullmatch(r'<iframe srcdoc="([^"]*)" style="[^"]*"></iframe>', snippet)
    assert match and html.unescape(match.group(1)) == view.html == build_page(runs["text"], title="notebook")
