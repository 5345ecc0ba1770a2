"""The benchmarks say what decoded each figure's turns: the gym workload's modes record their decoding path
(run for real on a tiny model) and the report prints it beside the figures, with the reason on a fallback."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from textenv.engine.fast_path import GENERATE, LOOP

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import engines_report  # noqa: E402
import report  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model_folder(tmp_path_factory, tokenizer):
    from textenv.models import tiny_causal_lm

    folder = tmp_path_factory.mktemp("tiny")
    tiny_causal_lm(seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def gym_side(mode: str, model_folder: Path) -> dict:
    command = [sys.executable, str(BENCHMARKS / "gym_side.py"), "--mode", mode, "--model-path", str(model_folder),
               "--episodes", "2", "--turns", "2", "--max-new-tokens", "3", "--threads", "1"]
    output = subprocess.run(command, capture_output=True, text=True, check=True, cwd=BENCHMARKS).stdout
    (line,) = [line for line in output.splitlines() if line.startswith("BENCH_RESULT ")]
    return json.loads(line.removeprefix("BENCH_RESULT "))


def test_gym_modes_record_what_decoded_their_turns(tiny_model_folder):
    results = {mode: [gym_side(mode, tiny_model_folder)] for mode in ("scheduler", "naive", "text-env")}
    assert results["scheduler"][0]["decoding_path"] == LOOP
    assert results["text-env"][0]["decoding_path"] == LOOP
    assert results["naive"][0]["decoding_path"].startswith(GENERATE)
    table = report.gym_table(results, episodes=2, turns=2)
    assert table.splitlines()[0].endswith("| decoding path (Gym / TextEnv) |")
    assert table.splitlines()[2].endswith(f"| {LOOP} / {LOOP} |")


def test_the_transformers_continuous_batching_loop_plays_every_turn_and_says_so(tiny_model_folder):
    result = gym_side("transformers-cb", tiny_model_folder)
    assert result["decoding_path"].startswith("transformers' continuous batching (model.generate_batch")
    assert result["turns"] == 4 and all(len(replies) == 2 for replies in result["replies"])
    assert all(1 <= len(reply) <= 3 for replies in result["replies"] for reply in replies)


def test_a_fallback_is_printed_with_its_reason():
    fallback = f"{GENERATE} (its cache has DynamicSlidingWindowLayer layers)"
    runs = {"rollout": [{"decoding_path": fallback}], "turns": [{"decoding_path": LOOP}], "ppo-step": [{}]}
    assert report.path_label(runs["rollout"]) == GENERATE
    assert report.path_lines(runs) == [f"rollout: {fallback}", f"turns: {LOOP}"]


def test_the_continuous_batching_table_puts_the_medians_side_by_side():
    def runs(*seconds, replies=((1, 2), (3,))):
        return [{"seconds": value, "replies": [list(map(list, [reply])) for reply in replies]} for value in seconds]

    results = {"naive": runs(10.0, 12.0, 11.0), engines_report.TRANSFORMERS_CB: runs(16.0, 15.0, 17.0, replies=((1, 2), (4,))),
               "scheduler": runs(6.0, 5.0, 7.0), "script": "chat"}
    header, _, row = engines_report.transformers_cb_table(results, episodes=2, turns=1).splitlines()
    assert header.startswith("| episodes x turns, env | runs per side | naive loop (generate) s | transformers continuous batching s")
    assert row == "| 2 x 1, chat | 3 | 11 | 16 | 6 | **2.67x** | 1/2, 1/2 |"


def test_the_transformers_backend_mode_plays_the_episodes_of_textenvs_engine(tiny_model_folder):
    served, in_process = gym_side("scheduler-transformers", tiny_model_folder), gym_side("scheduler", tiny_model_folder)
    assert served["decoding_path"] == "transformers continuous batching (sdpa attention)"
    assert served["turns"] == in_process["turns"] == 4 and served["replies"] == in_process["replies"]


def test_the_backends_table_lists_every_path_that_ran_against_the_generate_loop():
    def runs(*seconds, replies=((1, 2), (3,)), path=LOOP):
        return [{"seconds": value, "decoding_path": path, "replies": [list(map(list, [reply])) for reply in replies]} for value in seconds]

    results = {"naive": runs(12.0, 10.0, 11.0, path=GENERATE), "scheduler": runs(5.0, 6.0, 4.0),
               engines_report.TRANSFORMERS_BACKEND: runs(8.0, 9.0, 7.0, replies=((1, 2), (4,)), path="transformers continuous batching (sdpa attention)"),
               "script": "chat"}
    header, _, *rows = engines_report.backends_table(results).splitlines()
    assert header == "| " + " | ".join(engines_report.BACKENDS_HEADER) + " |"
    assert rows == [f"| per-turn `generate` loop (no textenv) | 3 | 11 | 1.00x | 2/2 | {GENERATE} |",
                    f"| GymScheduler, engine=\"textenv\" | 3 | 5 | 2.20x | 2/2 | {LOOP} |",
                    "| GymScheduler, engine=\"transformers\" | 3 | 8 | 1.38x | 1/2 | transformers continuous batching |"]
