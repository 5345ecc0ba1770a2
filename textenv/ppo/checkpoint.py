"""Checkpoint and resume for [`PPOTrainer`] and [`GRPOTrainer`], and `TrainerSaving`, their saving methods.

A checkpoint folder holds, through ``accelerate``'s ``save_state``: the policy with its value head
(``model.safetensors``), the optimizer, the learning-rate scheduler and every process's RNG state
(python, numpy, torch, CUDA) with the gradient-accumulation counter; and ``trainer_state.json`` with the
step counter and, for PPO, the KL controller and the score-scaling statistics.

It is written to a hidden temporary folder and renamed into place, so a checkpoint interrupted by a kill is
never mistaken for a complete one: [`find_latest_checkpoint`] only returns folders that hold
``trainer_state.json`` (written last) and ignores temporary ones.

The reference model is not saved: to resume, build the trainer exactly as for the original run (same
initial model, so the same reference), then call ``trainer.load_checkpoint(path)``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

STATE_FILE = "trainer_state.json"
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_name(step: int) -> str:
    return f"checkpoint-{step}"


def save_checkpoint(trainer, output_dir: str | os.PathLike, run_state: dict | None = None) -> str:
    """Write ``output_dir`` atomically (all processes must call this). Returns the folder path.

    Args:
        trainer (`PPOTrainer`): the trainer to save.
        output_dir (`str` or `os.PathLike`): the checkpoint folder.
        run_state (`dict`, *optional*): JSON-serialisable state of the run around the trainer (where the
            episode source is), saved in the same atomic write and returned by `load_checkpoint`.
    """
    accelerator = trainer.accelerator
    final = Path(output_dir)
    staging = final.parent / f".{final.name}.tmp"
    if accelerator.is_main_process:
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging), safe_serialization=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        state = {
            "step": trainer.current_step,
            "trainer": type(trainer).__name__,
            "config": trainer.config.to_dict(),
            "num_processes": accelerator.num_processes,
            "run": run_state or {},
        }
        if hasattr(trainer, "kl_ctl"):  # PPO's KL control and score statistics (GRPO has neither)
            state["kl_controller"] = {"type": type(trainer.kl_ctl).__name__, **trainer.kl_ctl.state_dict()}
            state["running_moments"] = trainer.running.state_dict()
            state["highest_reward"] = float(trainer.highest_reward)
        (staging / STATE_FILE).write_text(json.dumps(state, indent=2, default=str))
        _replace_folder(staging, final)
    accelerator.wait_for_everyone()
    return str(final)


def _replace_folder(source: Path, target: Path) -> None:
    """Move ``source`` to ``target``; an existing ``target`` is moved aside first and removed last."""
    old = target.parent / f".{target.name}.old"
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    os.replace(source, target)
    shutil.rmtree(old, ignore_errors=True)


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    path = Path(path)
    return path.is_dir() and not path.name.startswith(".") and (path / STATE_FILE).is_file()


def find_latest_checkpoint(root: str | os.PathLike) -> str | None:
    """The complete ``checkpoint-N`` folder under ``root`` with the largest ``N``, or None."""
    root = Path(root)
    if not root.is_dir():
        return None
    found = []
    for child in root.iterdir():
        match = CHECKPOINT_PATTERN.match(child.name)
        if match and is_complete_checkpoint(child):
            found.append((int(match.group(1)), child))
    return str(max(found)[1]) if found else None


def load_checkpoint(trainer, checkpoint_dir: str | os.PathLike) -> dict:
    """Restore model, optimizer, scheduler, RNG and step counter (and PPO's KL controller and score statistics).

    Returns:
        The saved state (``state["step"]``: PPO steps done; ``state["run"]``: the `run_state` given to
        `save_checkpoint`).

    Raises:
        FileNotFoundError: the folder is not a complete checkpoint.
        ValueError: it was saved by the other algorithm's trainer.
    """
    path = Path(checkpoint_dir)
    if not is_complete_checkpoint(path):
        raise FileNotFoundError(f"{path} is not a complete PPO checkpoint (no {STATE_FILE})")
    state = json.loads((path / STATE_FILE).read_text())
    if ("kl_controller" in state) != hasattr(trainer, "kl_ctl"):  # a PPO checkpoint into a GRPO trainer or back
        saved_by = state.get("trainer", "PPOTrainer")
        raise ValueError(f"{path} was saved by a {saved_by}; resume it with one (this is a {type(trainer).__name__}).")
    trainer.accelerator.load_state(str(path))
    trainer.current_step = int(state["step"])
    if not hasattr(trainer, "kl_ctl"):
        return state
    controller = dict(state["kl_controller"])
    controller_type = controller.pop("type")
    if controller_type != type(trainer.kl_ctl).__name__:
        raise ValueError(f"The checkpoint used {controller_type}, this trainer {type(trainer.kl_ctl).__name__} (adap_kl_ctrl differs)")
    trainer.kl_ctl.load_state_dict(controller)
    trainer.running.load_state_dict(state["running_moments"])
    import torch

    trainer.highest_reward = torch.tensor(float(state["highest_reward"]))
    return state


class TrainerSaving:
    """`save_pretrained`, `save_checkpoint` and `load_checkpoint` of a step-based trainer (its `accelerator`,
    `model` and `tokenizer`)."""

    def save_pretrained(self, save_directory: str) -> None:
        """Save the policy (with its value head, for PPO; its adapters, for PEFT) and the tokenizer for
        ``from_pretrained``."""
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            self.accelerator.unwrap_model(self.model).save_pretrained(save_directory)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(save_directory)

    def save_checkpoint(self, output_dir: str) -> str:
        """Save everything needed to resume (see [`textenv.ppo.checkpoint.save_checkpoint`])."""
        return save_checkpoint(self, output_dir)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Restore a checkpoint written by [`save_checkpoint`] into this trainer."""
        load_checkpoint(self, checkpoint_dir)
