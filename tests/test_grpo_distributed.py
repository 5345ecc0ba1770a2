"""GRPOTrainer across 2 CPU processes (torchrun, gloo): each rank trains its own group, DDP averages the gradients,
and dapo's token count is the global one, so the ranks end the step with the weights a single process reaches on
both groups at once.

Tolerances (tests/numerics.py has the analysis): the ranks' weights are bit-identical (DDP hands both the same
all-reduced gradient, and they run the same optimizer on the same weights). Against one process training both
groups, the weights agree only in exact arithmetic (one process pads both groups' rows together and sums two
mini-batches' gradients; DDP averages two ranks'), so the model is float64 and the optimizer SGD, and the weights
agree within `float64_sgd_tolerance` of one step at lr 1 (and moved 1000 times more than that). The advantages
are exact: each group's mean and std are sums of two terms, the same in any order.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "scripts"))

from grpo_ddp_worker import VOCAB, grpo_episodes, grpo_trainer  # noqa: E402
from test_ppo_distributed import _free_port  # noqa: E402

from numerics import float64_model, float64_sgd_tolerance  # noqa: E402

from textenv.testing import tiny_causal_lm  # noqa: E402

WORKER = Path(__file__).parent / "scripts" / "grpo_ddp_worker.py"


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_two_processes_train_their_groups_like_one_process_on_both(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(_free_port()), str(WORKER), str(tmp_path)]
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=380)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    assert [result["num_processes"] for result in ranks] == [2, 2]
    assert torch.equal(ranks[0]["weights"], ranks[1]["weights"])  # DDP averaged the gradients

    together = [sum(parts, []) for parts in zip(*(map(list, grpo_episodes(rank)) for rank in (0, 1)))]
    single = grpo_trainer(batch_size=4)
    stats = single.step(*together)
    weights = torch.cat([p.detach().flatten() for p in single.model.parameters()])
    initial = torch.cat([p.detach().flatten() for p in float64_model(tiny_causal_lm(vocab_size=VOCAB, seed=0)).parameters()])
    queries, responses, _ = together
    length = max(len(q) + len(r) for q, r in zip(queries, responses))
    tolerance = float64_sgd_tolerance(single.model.config, length, sum(len(r) for r in responses), learning_rate=1.0, steps=1)
    assert ranks[0]["weights"].dtype == torch.float64 and (weights - initial).abs().max() > 1e3 * tolerance  # it trained
    # a local token mean would give another update
    torch.testing.assert_close(ranks[0]["weights"], weights, rtol=0, atol=tolerance)
    assert torch.equal(torch.cat([ranks[0]["advantages"], ranks[1]["advantages"]]), stats["grpo/advantages"])
