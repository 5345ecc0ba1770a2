"""The `async` benchmark workload (`benchmarks/async_bench.py`): the `textenv train` options of each run, a run and
the evaluation of its weight copies end to end (the tiny model on the in-process engine, ``K=0``: the vLLM runs
are the benchmark's own), and the report's arithmetic by hand: time to the synchronous run's final accuracy,
the speed-up to it, and the accuracy at the wall time the fastest run ended."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import async_bench  # noqa: E402


def in_process_tiny(argv: list[str]) -> list[str]:
    """A run's options with the tiny model on the in-process engine (no server, no correction)."""
    argv = ["tiny" if arg == "bundled" else "textenv" if arg == "vllm" else arg for arg in argv]
    cut = argv.index("--vllm_server_url")
    argv = argv[:cut] + argv[cut + 2:]
    argv.remove("--vllm_importance_sampling_correction")
    return [*argv, "--max_new_tokens", "4", "--max_turns", "1"]


def test_each_run_is_textenv_train_with_only_max_staleness_differing(tmp_path):
    runs = {k: async_bench.train_argv("gym", k, 3, 4, "http://127.0.0.1:1", tmp_path) for k in (0, 2)}
    differing = [(a, b) for a, b in zip(runs[0], runs[2]) if a != b]
    assert differing == [("0", "2")] and runs[2][runs[2].index("--max_staleness") + 1] == "2"
    assert runs[0][runs[0].index("--steps") + 1] == "12"  # textenv train's --steps counts episodes
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 12


@pytest.mark.parametrize("task, extra", [("calculator", []), ("gym", []), ("calculator", ["--algorithm", "grpo", "--num_generations", "2"])],
                         ids=["calculator", "gym", "calculator-grpo"])
def test_a_run_keeps_its_weights_and_the_copies_are_evaluated(tmp_path, task, extra):
    argv = in_process_tiny(async_bench.train_argv(task, 0, 2, 4, "http://127.0.0.1:1", tmp_path, extra))
    assert argv[argv.index("--output_dir") + 2:][: len(extra)] == extra
    async_bench.run_one(argv, eval_every=1, threads=1, result_path=tmp_path / "run.pt")
    result = torch.load(tmp_path / "run.pt", weights_only=False)
    assert [copy["step"] for copy in result["copies"]] == [1, 2] and len(result["steps"]) == 2
    first, second = (copy["weights"] for copy in result["copies"])
    assert any("v_head" in name for name in first) == (not extra), "PPO trains a value head, GRPO (--train-args) none"
    if not extra:  # GRPO's tiny-model groups score alike: zero advantages, unchanged weights
        assert any(not torch.equal(a, b) for a, b in zip(first.values(), second.values()))
    async_bench.EVAL_TASKS[task] = 2
    evaluation = async_bench.evaluate_copies(task, argv, tmp_path / "run.pt", threads=1)
    assert [e["step"] for e in evaluation] == [1, 2] and all(0 <= e["greedy"] <= 1 and 0 <= e["sampled"] <= 1 for e in evaluation)
    summary = async_bench.summary(tmp_path / "run.pt", evaluation)
    assert summary["staleness_max"] == 0 and summary["wait_per_step"] == 0 and json.dumps(summary)


def run(seconds: float, evaluation: list[tuple[float, float]]) -> dict:
    return {"seconds": seconds, "seconds_per_step": seconds / 4, "wait_per_step": 0.5, "server_idle_per_step": 1.0, "pause_per_step": 0.2,
            "staleness_mean": 0.5, "staleness_max": 1, "dropped": 0,
            "evaluation": [{"step": 2 * (i + 1), "seconds": s, "greedy": a, "sampled": a} for i, (s, a) in enumerate(evaluation)]}


def test_the_report_times_the_synchronous_runs_final_accuracy_by_hand():
    results = {"gym": {"0": [run(100.0, [(50.0, 0.2), (100.0, 0.6)])], "1": [run(60.0, [(30.0, 0.4), (60.0, 0.7)])],
                       "2": [run(55.0, [(27.0, 0.3), (55.0, 0.5)])]}}
    results["gym"]["1"][0].update(ratio_mean=0.9876, ratio_max=2.5, clipped_frac=0.0123, masked_frac=0.0)
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]] for line in async_bench.report(results).splitlines()
            if line.startswith("| ") and not line.startswith("| K")}
    assert rows["0"][-3:-1] == ["100 s", "1.00x"]  # K=0 reaches its own final 60% at its end
    assert rows["1"][-3:-1] == ["60 s", "1.67x"]  # 70% >= 60% first at 60 s: 100 / 60
    assert rows["2"][-3:-1] == ["-", "not reached"]  # never 60%
    assert rows["1"][-4] == "40% / 40%" and rows["0"][-4] == "20% / 20%"  # at 55 s, the fastest run's end
    assert rows["1"][-1] == "0.988 / 2.50, 1.23%, 0.00%" and rows["0"][-1] == "-"  # the correction's weights; none logged at K=0


def test_the_benchmark_runner_hands_workloads_async_to_async_bench(monkeypatch, capsys):
    import run

    handed = []
    monkeypatch.setattr(async_bench, "measure", lambda *args: handed.append(args) or {})
    monkeypatch.setattr(sys, "argv", ["run.py", "--workloads", "async", "--tasks", "gym", "--staleness", "0", "2", "--steps", "3",
                                      "--vllm-url", "http://127.0.0.1:1"])
    run.main()

    tasks, staleness, steps, *_, url = handed[0][:7]
    assert (tasks, staleness, steps, url) == (["gym"], [0, 2], 3, "http://127.0.0.1:1")
    monkeypatch.setattr(sys, "argv", ["run.py", "--workloads", "async", "--staleness", "1"])
    with pytest.raises(SystemExit):
        run.main()
    assert "--staleness must include 0" in capsys.readouterr().err
