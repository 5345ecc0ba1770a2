"""The statistics of a PPO step (legacy keys and values) and their logging through accelerate's trackers."""

from __future__ import annotations

import warnings
from typing import Sequence

import torch

from textenv.ppo import core
from textenv.ppo.utils import WANDB_PADDING, convert_to_scalar, stack_dicts, stats_to_np


def stack_train_stats(all_stats: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack per-mini-batch statistics (`stack_dicts`); advantages and ratios are kept whole, not averaged:
    flattened to `[1, n]` with NaN -> -1."""
    stacked = stack_dicts(all_stats)
    for key in ("policy/advantages", "policy/ratio"):
        stacked[key] = torch.nan_to_num(stacked[key].flatten().unsqueeze(0), WANDB_PADDING)
    return stacked


class StepStatisticsMixin:
    """`record_step_stats`, `gather_stats` and `log_stats` of [`PPOTrainer`]."""

    def record_step_stats(self, kl_coef: float, **data) -> dict:
        """The legacy step statistics from the batch tensors and the stacked train statistics."""
        mask = data["masks"]
        kl_per_sequence = (data["kls"] * mask).sum(dim=-1)  # [B]
        mean_kl = kl_per_sequence.mean()
        mean_entropy = (-data["logprobs"] * mask).sum(dim=-1).mean()
        if mean_kl.item() < -1.0:
            warnings.warn(
                f"KL divergence is starting to become negative: {mean_kl.item():.2f} - this might be a precursor "
                "for failed training. Sometimes this happens because the generation kwargs are not correctly set. "
                "Please make sure that the generation kwargs are set correctly, or review your training "
                "hyperparameters.",
                UserWarning,
                stacklevel=3,
            )
        scores = data["scores"].float()
        stats = {
            "objective/kl": mean_kl,
            "objective/kl_dist": kl_per_sequence,
            "objective/logprobs": data["logprobs"],
            "objective/ref_logprobs": data["ref_logprobs"],
            "objective/kl_coef": kl_coef,
            "objective/entropy": mean_entropy,
            "ppo/mean_non_score_reward": core.masked_mean(data["non_score_reward"], mask),
            "ppo/mean_scores": scores.mean(),
            "ppo/std_scores": scores.std(),
        }
        query_lens = torch.tensor([len(q) for q in data["queries"]], dtype=torch.float)
        response_lens = torch.tensor([len(r) for r in data["responses"]], dtype=torch.float)
        stats["tokens/queries_len_mean"] = query_lens.mean().item()
        stats["tokens/queries_len_std"] = query_lens.std().item()
        stats["tokens/queries_dist"] = query_lens.numpy()
        stats["tokens/responses_len_mean"] = response_lens.mean().item()
        stats["tokens/responses_len_std"] = response_lens.std().item()
        stats["tokens/responses_dist"] = response_lens.numpy()
        for key, value in data["train_stats"].items():
            stats[f"ppo/{key}"] = value.float().mean(dim=0)
        stats["ppo/val/var_explained"] = 1 - stats["ppo/val/error"] / stats["ppo/returns/var"]
        return stats

    def gather_stats(self, stats: dict) -> dict:
        """Average every tensor statistic over the processes."""
        gathered = {}
        for key, value in stats.items():
            if isinstance(value, torch.Tensor):
                value = self.accelerator.reduce(value.detach().float().to(self.current_device), reduction="mean")
            gathered[key] = value
        return gathered

    def log_stats(
        self,
        stats: dict,
        batch: dict,
        rewards: Sequence[torch.Tensor] | torch.Tensor,
        columns_to_log: Sequence[str] = ("query", "response"),
    ) -> None:
        """Log step statistics and reward summaries through the accelerate trackers (wandb also gets a table
        of ``columns_to_log``)."""
        if not isinstance(rewards, torch.Tensor):
            rewards = torch.stack([torch.as_tensor(r).reshape(()) for r in rewards])
        rewards = self.accelerator.gather(rewards.float().to(self.current_device)).flatten()
        if self.config.log_with == "wandb":
            import wandb

            if any(column not in batch for column in columns_to_log):
                raise ValueError(f"Columns to log {columns_to_log} are not present in the batch {list(batch)}.")
            rows = [list(values) + [reward.item()] for values, reward in zip(zip(*(batch[c] for c in columns_to_log)), rewards)]
            if self.accelerator.is_main_process:
                stats = dict(stats, game_log=wandb.Table(columns=[*columns_to_log, "reward"], rows=rows))
        elif "query" not in batch and "response" not in batch:
            warnings.warn("The game logs will not be logged because the batch does not contain the keys 'query' and 'response'.", UserWarning, stacklevel=2)
        logs = convert_to_scalar(stats_to_np(stats))
        logs["env/reward_mean"] = rewards.mean().item()
        logs["env/reward_std"] = rewards.std().item() if rewards.numel() > 1 else 0.0
        logs["env/reward_dist"] = rewards.cpu().numpy()
        if self.config.log_with == "tensorboard":
            logs = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
        self.accelerator.log(logs, step=self.current_step)

