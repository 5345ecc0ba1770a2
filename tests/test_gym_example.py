"""The gym example (examples/gym_env.py): its guess-the-number env's step rewards, `textenv.gym.evaluate`, and
a small end-to-end run on the bundled model (measure -> PPO -> measure, the run directory `textenv view` reads)."""

import re
import runpy
from pathlib import Path

import pytest

from textenv.gym import GymScheduler, ScriptedPolicy, evaluate, load_plugins, read_completions
from textenv.training import GREEDY_KWARGS
from textenv.view import load_run

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def scripted_guesses(guesses_by_secret: dict[int, list[str]]):
    """A reply function playing the listed guesses of the game whose secret the context's first message names."""

    def reply(context: str) -> str:
        secret = int(re.search(r"secret is (\d+)", context).group(1)) if "secret is" in context else None
        turn = context.count("<|im_start|>assistant") - 1
        return guesses_by_secret[secret][turn]

    return reply


@pytest.fixture
def guess_scheduler(tokenizer, monkeypatch):
    load_plugins(EXAMPLES / "gym_plugin.py")
    from textenv.gym import envs

    class Peeking(envs["guess_number"]):  # lets the scripted policy see which game it plays
        async def reset(self, config):
            observation, info, system = await super().reset(config)
            return f"{observation} (The secret is {self.secret}.)", info, system

    monkeypatch.setitem(envs, "peeking_guess", Peeking)
    guesses = {7: ["5", "3", "hello", "7"], 1: ["10", "9", "8", "7"]}
    policy = ScriptedPolicy(tokenizer, scripted_guesses(guesses))
    return GymScheduler(tokenizer=tokenizer, policy=policy, gym_env="peeking_guess", max_turns=4, generation_kwargs={"max_new_tokens": 4})


def test_guess_number_step_rewards_and_hints(guess_scheduler):
    won, lost = guess_scheduler.run([{"secret": 7}, {"secret": 1}])
    assert won.trajectory_infos[0] == {"secret": 7}
    assert [info["guess"] for info in won.trajectory_infos[1:]] == [5, 3, None, 7]
    # 5: a possible miss (0.2); 3: below the "Higher." of 5 (0); no number (0); the hit (1)
    assert won.step_rewards == [0.2, 0.0, 0.0, 1.0] and won.finish_reason == "done"
    observations = [message["content"] for message in won.messages if message["role"] == "user"][1:]
    assert observations == ["Higher. Guess again.", "Higher. Guess again.", "Answer with a number."]
    # four possible misses: partial credit stops at 0.8, so an unsolved game stays below 1
    assert lost.step_rewards == pytest.approx([0.2, 0.2, 0.2, 0.2]) and lost.finish_reason == "max_turns"


def test_gym_evaluate_counts_games_won_and_restores_generation_kwargs(guess_scheduler):
    evaluation = evaluate(guess_scheduler, [{"secret": 7}, {"secret": 1}], sample=False)
    assert evaluation.accuracy == 0.5
    assert evaluation.rewards == pytest.approx([1.2, 0.8])
    assert [episode.trajectory_infos[-1]["guess"] for episode in evaluation.histories] == [7, 7]
    assert guess_scheduler.generation_kwargs == {"max_new_tokens": 4}


def test_gym_evaluate_decodes_greedy_or_sampled(guess_scheduler, monkeypatch):
    seen = []
    original = type(guess_scheduler).arun

    async def recording_arun(self, rows, **kwargs):
        seen.append(dict(self.generation_kwargs))
        return await original(self, rows, **kwargs)

    monkeypatch.setattr(type(guess_scheduler), "arun", recording_arun)
    evaluate(guess_scheduler, [{"secret": 7}], sample=False)
    evaluate(guess_scheduler, [{"secret": 7}], sample=True)
    assert seen[0] == {"max_new_tokens": 4, **GREEDY_KWARGS}
    assert seen[1]["do_sample"] is True and seen[1]["temperature"] == 1.0


@pytest.mark.slow
def test_gym_example_end_to_end(tmp_path, capsys):
    main = runpy.run_path(str(EXAMPLES / "gym_env.py"))["main"]
    argv = ["--ppo_steps", "1", "--batch_size", "2", "--mini_batch_size", "2", "--eval_tasks", "3", "--max_turns", "2",
            "--threads", "0", "--no_progress", "--output_dir", str(tmp_path)]
    result = main(argv)
    assert set(result) >= {"sampled_before", "sampled_after", "greedy_before", "greedy_after", "seconds"}
    assert all(0.0 <= result[key] <= 1.0 for key in ("sampled_before", "sampled_after", "greedy_before", "greedy_after"))
    assert len(result["train_rewards"]) == 1
    records = read_completions(tmp_path / "completions.jsonl")
    assert [record["env"] for record in records] == ["guess_number", "guess_number"]
    assert all("guess" in info and "try" in info for record in records for info in record["trajectory_infos"][1:])
    run = load_run(tmp_path)
    phases = sorted({episode["phase"] for episode in run.episodes})
    assert phases == ["eval-after-greedy", "eval-after-sampled", "eval-before-greedy", "eval-before-sampled", "train"]
    assert sum(episode["phase"] == "eval-before-greedy" for episode in run.episodes) == 3 and len(run.steps) == 1
    assert "held-out games won of 3, before -> after training" in capsys.readouterr().out
