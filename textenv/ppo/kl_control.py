"""The KL-coefficient controllers and the running score statistics of PPO (legacy TRL ``trainer/utils.py``)."""

from __future__ import annotations

import numpy as np
import torch


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019): ``coef *= 1 + clip(kl / target - 1, -0.2, 0.2) *
    n_steps / horizon``."""

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current: float, n_steps: int) -> None:
        proportional_error = float(np.clip(float(current) / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.target, self.horizon = float(state["value"]), float(state["target"]), float(state["horizon"])


class FixedKLController:
    """Constant KL coefficient."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class RunningMoments:
    """Running mean and standard deviation of scores (parallel-variance update), aggregated across processes
    when an ``accelerator`` with several processes is given."""

    def __init__(self, accelerator=None):
        self.accelerator = accelerator
        self.mean = 0.0
        self.std = 1.0
        self.var = 1.0
        self.count = 1e-24

    @torch.no_grad()
    def update(self, xs: torch.Tensor) -> tuple[float, float]:
        """Fold a batch into the running statistics; returns the batch's `(mean, unbiased std)`."""
        xs = xs.float()
        if self.accelerator is not None and self.accelerator.num_processes > 1:
            xs_mean, xs_var, xs_count = global_mean_var(self.accelerator, xs)
        else:
            xs_count = xs.numel()
            xs_var, xs_mean = torch.var_mean(xs, unbiased=False)
        delta = xs_mean - self.mean
        total_count = self.count + xs_count
        new_sum = xs_var * xs_count
        old_sum = self.var * self.count + delta**2 * self.count * xs_count / total_count
        new_var = (old_sum + new_sum) / total_count
        self.mean += (delta * xs_count / total_count).item()
        self.std = (new_var * total_count / (total_count - 1)).sqrt().item()
        self.var = new_var.item()
        self.count = float(total_count)
        return xs_mean.item(), (xs_var * xs_count / (xs_count - 1)).sqrt().item()

    def state_dict(self) -> dict:
        return {"mean": self.mean, "std": self.std, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.std, self.var, self.count = (float(state[k]) for k in ("mean", "std", "var", "count"))


def global_mean_var(accelerator, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Mean, biased variance and element count of ``xs`` over all processes."""
    sum_and_count = torch.tensor([xs.sum(), xs.numel()], dtype=torch.float64, device=xs.device)
    sum_and_count = accelerator.reduce(sum_and_count, reduction="sum")
    total, count = sum_and_count
    mean = (total / count).float()
    squared = accelerator.reduce(((xs - mean) ** 2).sum().double().reshape(1), reduction="sum")
    return mean, (squared[0] / count).float(), count.item()
