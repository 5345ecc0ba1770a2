"""Checkpoint and resume of PPOTrainer: a resumed run takes the same next step as an uninterrupted one, and
an interrupted checkpoint is never taken for a complete one.

Tolerances: none. A resumed trainer holds bit for bit the weights, optimizer moments, scheduler, KL controller,
running moments and RNG states of the uninterrupted one, and runs the same kernels on the same inputs in the
same process, so its next step's statistics are equal (``==``, `np.array_equal` for the arrays) and its weights
`torch.equal`; anything else is a checkpoint that lost or rounded some state.
"""

import copy
import warnings

import numpy as np
import pytest
import torch

from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from textenv.ppo.checkpoint import STATE_FILE, find_latest_checkpoint
from textenv.testing import tiny_causal_lm

_BASE = {}


def make_trainer():
    if not _BASE:
        _BASE["policy"] = tiny_causal_lm(seed=0)
        _BASE["reference"] = tiny_causal_lm(seed=1)
    torch.manual_seed(0)
    model = AutoModelForCausalLMWithValueHead(copy.deepcopy(_BASE["policy"]))
    reference = AutoModelForCausalLMWithValueHead(copy.deepcopy(_BASE["reference"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    config = PPOConfig(batch_size=4, mini_batch_size=1, gradient_accumulation_steps=2, ppo_epochs=2, seed=7,
                       use_score_scaling=True, use_score_norm=True, horizon=100.0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")
        return PPOTrainer(config, model, ref_model=reference, optimizer=optimizer, lr_scheduler=scheduler)


def episodes(offset):
    queries = [torch.arange(3 + i) + 100 + offset for i in range(4)]
    responses = [torch.arange(6 - i) + 200 + offset for i in range(4)]
    scores = [torch.tensor(float(i + offset)) for i in range(4)]
    masks = [torch.tensor([1] * (6 - i - 2) + [0, 1]) for i in range(4)]
    return queries, responses, scores, masks


def weights(trainer):
    return torch.cat([p.detach().flatten() for p in trainer.model.parameters()])


COMPARED = ("ppo/loss/total", "ppo/loss/policy", "ppo/loss/value", "objective/kl_coef", "ppo/mean_scores",
            "ppo/learning_rate", "ppo/policy/ratio", "ppo/val/vpred")


def test_resume_takes_the_same_next_step(tmp_path):
    uninterrupted = make_trainer()
    uninterrupted.step(*episodes(0))
    path = uninterrupted.save_checkpoint(str(tmp_path / "checkpoint-1"))
    saved_kl_coef, saved_running = uninterrupted.kl_ctl.value, uninterrupted.running.state_dict()
    expected = uninterrupted.step(*episodes(1))

    resumed = make_trainer()
    resumed.load_checkpoint(path)
    assert resumed.current_step == 1
    assert resumed.kl_ctl.value == saved_kl_coef != 0.2
    assert resumed.running.state_dict() == saved_running
    got = resumed.step(*episodes(1))
    for key in COMPARED:
        assert np.array_equal(got[key], expected[key]), key
    assert torch.equal(weights(resumed), weights(uninterrupted))
    assert resumed.kl_ctl.value == uninterrupted.kl_ctl.value
    assert resumed.running.state_dict() == uninterrupted.running.state_dict()

    # Without the checkpoint the same step gives something else: the comparison above can fail.
    fresh = make_trainer()
    other = fresh.step(*episodes(1))
    assert not torch.equal(weights(fresh), weights(uninterrupted))
    assert other["ppo/learning_rate"] != expected["ppo/learning_rate"]


def test_interrupted_checkpoint_is_ignored(tmp_path, monkeypatch):
    trainer = make_trainer()
    trainer.step(*episodes(0))
    trainer.save_checkpoint(str(tmp_path / "checkpoint-1"))
    assert find_latest_checkpoint(tmp_path) == str(tmp_path / "checkpoint-1")

    def killed(output_dir, **kwargs):
        (torch.save({"partial": 1}, f"{output_dir}/optimizer.bin"))
        raise KeyboardInterrupt("killed while saving")

    monkeypatch.setattr(trainer.accelerator, "save_state", killed)
    with pytest.raises(KeyboardInterrupt):
        trainer.save_checkpoint(str(tmp_path / "checkpoint-2"))
    assert not (tmp_path / "checkpoint-2").exists()
    assert (tmp_path / ".checkpoint-2.tmp").exists()  # the half-written staging folder
    (tmp_path / "checkpoint-3").mkdir()  # a folder without trainer_state.json (e.g. copied by hand)
    assert find_latest_checkpoint(tmp_path) == str(tmp_path / "checkpoint-1")
    with pytest.raises(FileNotFoundError, match=STATE_FILE):
        trainer.load_checkpoint(str(tmp_path / "checkpoint-3"))


def test_checkpoint_overwrite_and_latest(tmp_path):
    trainer = make_trainer()
    assert find_latest_checkpoint(tmp_path / "missing") is None
    trainer.save_checkpoint(str(tmp_path / "checkpoint-2"))
    trainer.step(*episodes(0))
    trainer.save_checkpoint(str(tmp_path / "checkpoint-10"))
    trainer.save_checkpoint(str(tmp_path / "checkpoint-10"))  # overwrite in place
    assert find_latest_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-2"]
    for name in ("model.safetensors", "optimizer.bin", "scheduler.bin", STATE_FILE):
        assert (tmp_path / "checkpoint-10" / name).is_file(), name
