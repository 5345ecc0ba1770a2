"""The physical limit of the benchmark machine, and the model FLOPs of each workload.

    python benchmarks/flops.py --threads 2      # prints the matmul ceiling as one JSON line

**Ceiling.** `matmul_peak_gflops(dtype, threads)` times torch matmuls shaped like SmolLM2-135M's GEMMs
(hidden 576, intermediate 1536, vocab 49152; M = 512 and 1024 rows): for every shape one warm-up call,
then several timed calls; a shape's rate is the median of its calls, and the ceiling is the best shape's
rate. It is the sustained rate this machine reaches on dense GEMMs of this model's sizes, with this many
torch threads, for float32 and bfloat16. No real workload can do its matmuls faster.

**Model FLOPs** (multiply-add = 2 FLOPs), from the model's `config.json` (the bundled model folder,
`textenv.models.bundled_model_path()`):

- non-embedding parameters P = layers x (q, k, v, o projection weights + gate, up, down weights, and
  their biases when the config has them). RMSNorm weights, rotary embeddings and the value head
  (hidden x 1) are elementwise or negligible and are left out.
- a forward pass over a sequence of n tokens, with logits needed at h of its positions, costs

      2 P n                                   (layer weights, every token)
    + 2 x hidden x vocab x h                  (LM head, only where logits are needed)
    + 4 x (heads x head_dim) x layers x sum_{p=1..n} p      (attention: QK^T and AV of every token
                                                            over its causal context of p tokens)

  (heads x head_dim = hidden for this model; that is the `4 x hidden x context` per token and layer).
- a backward pass costs 2 x its forward.

Per workload, the *minimal* work (what any implementation must compute; an implementation may do less by
sharing work, e.g. computing a shared prompt once, and then shows a higher rate):

- **PPO step** (`ppo_step_flops`): for every row, the sequence is query + response (its real tokens, no
  padding) with the LM head on the response's positions (the logits that predict the response tokens,
  one per response token): one policy forward + one reference forward + `ppo_epochs` x (forward +
  backward), i.e. (2 + 3 x ppo_epochs) forwards of every row.
- **rollout** (`rollout_flops`): one forward over every token of every final episode (prompt + query +
  every model turn and tool response), each token counted once, with the LM head on the positions that
  predict a generated token (one per generated token).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Iterable

HIDDEN, INTERMEDIATE, VOCAB = 576, 1536, 49152
ROWS = (512, 1024)
# (K, N) of the model's GEMMs: q/o projection, gate/up projection, down projection, LM head.
GEMM_SHAPES = ((HIDDEN, HIDDEN), (HIDDEN, INTERMEDIATE), (INTERMEDIATE, HIDDEN), (HIDDEN, VOCAB))


# ------------------------------------------------------------------------------ model FLOPs
def load_model_config(model_path: str | Path | None = None) -> dict[str, Any]:
    """The `config.json` of `model_path` (default: the bundled model folder)."""
    if model_path is None:
        from textenv.models import bundled_model_path

        model_path = bundled_model_path()
    return json.loads((Path(model_path) / "config.json").read_text())


def _attention_width(config: dict[str, Any]) -> int:
    heads = config["num_attention_heads"]
    return heads * config.get("head_dim", config["hidden_size"] // heads)


def non_embedding_parameters(config: dict[str, Any]) -> int:
    """P: the layers' projection weights (and biases when the config has them)."""
    hidden, intermediate = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    kv_width = config.get("num_key_value_heads", heads) * head_dim
    q_width = heads * head_dim
    attention = hidden * q_width + 2 * hidden * kv_width + q_width * hidden
    if config.get("attention_bias"):
        attention += q_width + 2 * kv_width + hidden
    mlp = 3 * hidden * intermediate
    if config.get("mlp_bias"):
        mlp += 2 * intermediate + hidden
    return config["num_hidden_layers"] * (attention + mlp)


def forward_flops(config: dict[str, Any], tokens: int, logit_positions: int) -> int:
    """FLOPs of one causal forward pass over `tokens` tokens with logits at `logit_positions` positions."""
    weights = 2 * non_embedding_parameters(config) * tokens
    lm_head = 2 * config["hidden_size"] * config["vocab_size"] * logit_positions
    attention = 4 * _attention_width(config) * config["num_hidden_layers"] * tokens * (tokens + 1) // 2
    return weights + lm_head + attention


def ppo_step_flops(config: dict[str, Any], query_lengths: Iterable[int], response_lengths: Iterable[int], ppo_epochs: int = 4) -> int:
    """Minimal FLOPs of one PPO step: policy + reference forward and `ppo_epochs` x (forward + backward,
    = 3 forwards) of every row (query + response, LM head on the response positions)."""
    forward = sum(forward_flops(config, q + r, r) for q, r in zip(query_lengths, response_lengths, strict=True))
    return (2 + 3 * ppo_epochs) * forward


def rollout_flops(config: dict[str, Any], episodes: Iterable[dict[str, Any]]) -> int:
    """Minimal FLOPs of a rollout: one forward over each final episode (as `workload.episode_record` stores
    it: `query_length` prompt + query tokens, then segments), LM head on one position per generated token."""
    total = 0
    for episode in episodes:
        tokens = episode["query_length"] + sum(len(segment["ids"]) for segment in episode["segments"])
        generated = sum(len(segment["ids"]) for segment in episode["segments"] if not segment["system"])
        total += forward_flops(config, tokens, generated)
    return total


# ------------------------------------------------------------------------------ the ceiling
def matmul_peak_gflops(dtype, threads: int, shapes=None, rows=ROWS, repeats: int = 5) -> dict[str, Any]:
    """Sustained matmul GFLOP/s of this machine: for each (M, K, N), one warm-up then `repeats` timed
    `A[M,K] @ B[K,N]`; the median rate per shape, and `peak`, the best shape's median."""
    import torch

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(0)
    results = []
    try:
        for k, n in shapes or GEMM_SHAPES:
            for m in rows:
                a = torch.randn(m, k, generator=generator).to(dtype)
                b = torch.randn(k, n, generator=generator).to(dtype)
                out = torch.empty(m, n, dtype=dtype)
                torch.matmul(a, b, out=out)  # warm-up
                times = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    torch.matmul(a, b, out=out)
                    times.append(time.perf_counter() - start)
                gflops = 2 * m * k * n / statistics.median(times) / 1e9
                results.append({"m": m, "k": k, "n": n, "gflops": gflops})
    finally:
        torch.set_num_threads(previous_threads)
    return {"peak": max(result["gflops"] for result in results), "shapes": results}


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from textenv.hardware import describe_cpu

    result = {"threads": args.threads, "torch": torch.__version__, "cpu": describe_cpu()}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        measured = matmul_peak_gflops(dtype, args.threads, repeats=args.repeats)
        result[name] = measured["peak"]
        result[f"{name}_shapes"] = measured["shapes"]
    print("BENCH_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
