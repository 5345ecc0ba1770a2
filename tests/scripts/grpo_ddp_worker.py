"""One rank of the 2-process GRPO test (launched by tests/test_grpo_distributed.py with torchrun, gloo on CPU).

Every rank builds the same tiny model, gets its own group of episodes (`grpo_episodes(rank)`), runs one
GRPOTrainer.step and saves its trained weights and statistics to OUT_DIR/rank{N}.pt.
"""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for numerics (torchrun runs this file as a script)

from numerics import float64_model  # noqa: E402

from textenv.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from textenv.testing import tiny_causal_lm  # noqa: E402

VOCAB = 512


def grpo_episodes(rank: int):
    """Rank `rank`'s group of two episodes: its own query, responses of different lengths, scores 0 and 1 + rank."""
    query = torch.arange(3) + 10 * (rank + 1)
    responses = [torch.arange(4 + 2 * rank) + 50, torch.arange(3 + rank) + 90 + rank]
    return [query, query], responses, [torch.tensor(0.0), torch.tensor(1.0 + rank)]


def grpo_trainer(batch_size: int) -> GRPOTrainer:
    """The tiny model's trainer, in float64 with SGD (its update is the gradient itself: Adam's first step, about
    lr * sign(gradient), would magnify float rounding where a gradient is about 0; and the two runs reduce their
    gradients in other orders, which float64 makes 10^9 times smaller than in float32)."""
    model = float64_model(tiny_causal_lm(vocab_size=VOCAB, seed=0))
    config = GRPOConfig(batch_size=batch_size, mini_batch_size=2, num_generations=2, seed=3)
    return GRPOTrainer(config, model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0))


def main(out_dir: str) -> None:
    trainer = grpo_trainer(batch_size=2)
    rank = trainer.accelerator.process_index
    stats = trainer.step(*grpo_episodes(rank))
    weights = torch.cat([p.detach().flatten() for p in trainer.accelerator.unwrap_model(trainer.model).parameters()])
    result = {"num_processes": trainer.accelerator.num_processes, "weights": weights, "tokens": stats["tokens/trained"],
              "advantages": stats["grpo/advantages"]}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


if __name__ == "__main__":
    torch.set_num_threads(1)  # here, not at import: the test imports this module for its episodes
    main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: torch 2.13's gloo group can abort or hang in it (see ppo_ddp_worker.py)
