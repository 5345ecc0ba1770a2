"""One rank of the 2-process PPO test (launched by tests/test_ppo_distributed.py with torchrun, gloo on CPU).

Every rank builds the same tiny model, gets its own episodes (different lengths and scores), runs one
PPOTrainer.step, and writes its weights' fingerprint and some statistics to OUT_DIR/rank{N}.json.
"""

import hashlib
import json
import os
import sys
import warnings

import torch

torch.set_num_threads(1)

from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer  # noqa: E402
from textenv.testing import tiny_causal_lm  # noqa: E402


def main(out_dir: str) -> None:
    model = AutoModelForCausalLMWithValueHead(tiny_causal_lm(vocab_size=512, seed=0))
    initial = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
    config = PPOConfig(batch_size=2, mini_batch_size=1, ppo_epochs=2, learning_rate=1e-2, seed=3, max_grad_norm=10.0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")
        trainer = PPOTrainer(config, model)
    rank = trainer.accelerator.process_index
    # Rank-specific episodes: rank 1 has longer rows (padding across processes) and different scores.
    length = 4 + 3 * rank
    queries = [torch.arange(3) + 10 * (rank + 1) for _ in range(2)]
    responses = [torch.arange(length) + 50 + rank for _ in range(2)]
    scores = [torch.tensor(1.0 + 2 * rank), torch.tensor(1.0 + 2 * rank)]
    stats = trainer.step(queries, responses, scores)
    final = torch.cat([p.detach().flatten() for p in trainer.accelerator.unwrap_model(trainer.model).parameters()])
    result = {
        "rank": rank,
        "num_processes": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "weights_sha": hashlib.sha256(final.numpy().tobytes()).hexdigest(),
        "weights_changed": bool(not torch.equal(final, initial)),
        "mean_scores": stats["ppo/mean_scores"],
        "responses_len_mean": stats["tokens/responses_len_mean"],
        "logprobs_shape": list(stats["objective/logprobs"].shape),
        "loss_total": stats["ppo/loss/total"],
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(result, handle)


def exit_without_teardown() -> None:
    """Leave without running destructors. torch 2.13's gloo process group can abort ("terminate called without an
    active exception") or deadlock (its loop thread waits for the GIL while the DDP reducer's destructor joins it)
    when torn down at interpreter exit; both ranks have written their results by now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
    exit_without_teardown()
