"""The analytic FLOP counts of `benchmarks/flops.py`, checked by hand on a tiny config."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import flops  # noqa: E402

# hidden 4, 2 heads of width 2 (q width 4), 1 KV head (k, v width 2), intermediate 6, vocab 10, 2 layers.
TINY = {
    "hidden_size": 4,
    "intermediate_size": 6,
    "vocab_size": 10,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 2,
}


def test_non_embedding_parameters_by_hand():
    # per layer: q 4x4 = 16, k 4x2 = 8, v 4x2 = 8, o 4x4 = 16, gate/up/down 3 x 4x6 = 72 -> 120; 2 layers.
    assert flops.non_embedding_parameters(TINY) == 240
    # biases: q 4 + k 2 + v 2 + o 4 = 12 per layer.
    assert flops.non_embedding_parameters({**TINY, "attention_bias": True}) == 240 + 2 * 12


def test_forward_flops_by_hand():
    # 3 tokens, logits at 2 positions:
    #   weights   2 x 240 x 3                  = 1440
    #   LM head   2 x 4 x 10 x 2               =  160
    #   attention 4 x 4 x 2 layers x (1+2+3)   =  192
    assert flops.forward_flops(TINY, 3, 2) == 1440 + 160 + 192
    # one token, no logits: 2 x 240 + 4 x 4 x 2 x 1
    assert flops.forward_flops(TINY, 1, 0) == 480 + 32


def test_ppo_step_flops_by_hand():
    # rows (query 2, response 1) and (query 1, response 2): both forwards are over 3 tokens with logits at
    # 1 and 2 positions: 1440 + 80 + 192 and 1440 + 160 + 192.
    forward = (1440 + 80 + 192) + (1440 + 160 + 192)
    # policy + reference forward, and 4 epochs of forward + backward (3 forwards each): 14 forwards.
    assert flops.ppo_step_flops(TINY, [2, 1], [1, 2], ppo_epochs=4) == 14 * forward
    assert flops.ppo_step_flops(TINY, [2, 1], [1, 2], ppo_epochs=1) == 5 * forward


def test_rollout_flops_counts_each_token_once_and_logits_per_generated_token():
    # episode 1: prompt + query 2 tokens, a model turn of 1 token, a tool response of 1 token -> 4 tokens,
    # logits for 1 generated token; episode 2: 1 + 2 generated tokens -> 3 tokens, logits for 2.
    episodes = [
        {"query_length": 2, "segments": [{"system": False, "ids": [5]}, {"system": True, "ids": [6]}]},
        {"query_length": 1, "segments": [{"system": False, "ids": [7, 8]}]},
    ]
    expected = flops.forward_flops(TINY, 4, 1) + flops.forward_flops(TINY, 3, 2)
    assert expected == (2 * 240 * 4 + 2 * 4 * 10 * 1 + 4 * 4 * 2 * 10) + (1440 + 160 + 192)
    assert flops.rollout_flops(TINY, episodes) == expected


def test_bundled_model_config_is_smollm2_135m():
    config = flops.load_model_config()
    # 30 layers x (576^2 x 2 + 576 x 192 x 2 + 3 x 576 x 1536) = 30 x 3,538,944 = 106,168,320
    assert flops.non_embedding_parameters(config) == 106_168_320


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_peak_gflops_measures_a_rate(dtype):
    measured = flops.matmul_peak_gflops(dtype, threads=1, shapes=[(64, 64)], rows=(32, 64), repeats=3)
    assert [(s["m"], s["k"], s["n"]) for s in measured["shapes"]] == [(32, 64, 64), (64, 64, 64)]
    assert measured["peak"] == max(s["gflops"] for s in measured["shapes"]) > 0
