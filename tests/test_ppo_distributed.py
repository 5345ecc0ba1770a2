"""PPOTrainer across 2 CPU processes (torchrun, gloo): the ranks end a step with identical weights and
averaged statistics.

Tolerances: none. DDP hands both ranks the same all-reduced gradients and each runs the same optimizer on the
same weights, so the weights are bit-identical (compared by their SHA-256); a statistic averaged over the ranks
is one all-reduced value on both (a sum of two terms is the same in either order), so the ranks report it
``==``; the mean of the scores 1.0 and 3.0 is exactly 2.0 in float32; token counts are integers.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).parent / "scripts" / "ppo_ddp_worker.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_two_cpu_processes_train_in_lockstep(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(_free_port()), str(WORKER), str(tmp_path),
    ]
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=380)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]

    for result in ranks:
        assert result["num_processes"] == 2
        assert result["distributed_type"].endswith("MULTI_CPU")
        assert result["weights_changed"]
    # DDP averaged the gradients: both ranks hold the same weights after the step
    assert ranks[0]["weights_sha"] == ranks[1]["weights_sha"]
    # rank 0 scored 1.0, rank 1 scored 3.0: the reported statistic is the average over ranks
    assert ranks[0]["mean_scores"] == 2.0 and ranks[1]["mean_scores"] == 2.0
    assert ranks[0]["loss_total"] == ranks[1]["loss_total"]
    # rows were padded across processes (rank 1's rows are longer), so per-token stats line up
    assert ranks[0]["logprobs_shape"] == ranks[1]["logprobs_shape"] == [2, 9]
    # per-rank text statistics are not averaged (as in legacy TRL)
    assert (ranks[0]["responses_len_mean"], ranks[1]["responses_len_mean"]) == (4.0, 7.0)
