"""The workloads `run.py` measures: their names, which sides run them, and their sizes."""

from __future__ import annotations

import engines_report
import grpo_bench
import report
import vllm_bench

WORKLOADS = ("rollout", "turns", "ppo-step", "ppo-step-varied", "gym")  # the default set
GRPO_WORKLOAD = grpo_bench.WORKLOAD  # textenv's GRPO against TRL 1.16's GRPOTrainer: long, so only when named
ALL_WORKLOADS = (*WORKLOADS, GRPO_WORKLOAD)
ASYNC_WORKLOAD = "async"  # `--workloads async [async_bench.py's options]`: a run of its own (see main)
LEGACY_WORKLOADS = ("rollout", "turns", "ppo-step", "ppo-step-varied")  # need the legacy venv
PPO_WORKLOADS = ("ppo-step", "ppo-step-varied")
SIDE_WORKLOADS = ("rollout", "turns", *PPO_WORKLOADS)  # legacy against textenv
VLLM_WORKLOADS = ("rollout", "turns", "gym")  # also measured on vLLM with --engine vllm
PPO_EPOCHS = 4  # PPOConfig's default on both sides
GYM_MODES = ("naive", "scheduler", "text-env")
GYM_VLLM_MODES = tuple(mode + report.VLLM_SUFFIX for mode in ("scheduler", "text-env"))
GYM_CLIENT_LOOP = vllm_bench.CLIENT_LOOP  # a plain /v1/chat/completions loop on the same server (no textenv)
GYM_TRANSFORMERS_CB = engines_report.TRANSFORMERS_CB  # the naive loop on transformers' continuous batching: only when named
GYM_TRANSFORMERS_BACKEND = engines_report.TRANSFORMERS_BACKEND  # GymScheduler with engine="transformers": only when named
ALL_GYM_MODES = (*GYM_MODES, GYM_TRANSFORMERS_CB, GYM_TRANSFORMERS_BACKEND, *GYM_VLLM_MODES, GYM_CLIENT_LOOP)
ON_VLLM = {"vllm": " on vLLM"}  # what a workload's label says of its side
GYM_EPISODES, GYM_TURNS = 32, 6
ROLLOUT_QUERIES = 32
PPO_EPISODES = 8
MAX_NEW_TOKENS = 32
TURNS = tuple(range(1, 9))
