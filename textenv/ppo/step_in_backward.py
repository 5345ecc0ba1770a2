"""Optimizer steps fused into the backward pass: each parameter is updated as soon as its gradient is complete.

The gradients of the whole model then never exist at the same time (one model-sized buffer less at the
peak, and no fresh gradient memory to fault in on every mini-batch). The update is the optimizer's own
``step`` on that one parameter, with the optimizer's own state, learning rate and hooks, so checkpoints and
learning-rate schedulers see the usual optimizer. It equals a step after the full backward because a weight
is only updated after every backward node that reads it has run (PyTorch fires the post-accumulate-grad hook
after the last contribution to the gradient).

Only valid when nothing needs all gradients at once: no gradient clipping, accumulation, loss scaling or
cross-process reduction.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


class StepInBackward:
    """Hooks that run ``optimizer.step()`` on one parameter at a time while ``active()`` is entered.

    Args:
        optimizer: the optimizer that owns ``params`` (its param groups are narrowed to one parameter
            for each hooked step and restored afterwards).
        params: the trainable parameters to hook.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]):
        self.optimizer = optimizer
        self._enabled = False
        self._group_index = {
            id(param): index for index, group in enumerate(optimizer.param_groups) for param in group["params"]
        }
        missing = [param for param in params if id(param) not in self._group_index]
        if missing:
            raise ValueError(f"{len(missing)} trainable parameters are not in the optimizer's param groups")
        self._handles = [param.register_post_accumulate_grad_hook(self._step_parameter) for param in params]

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Backward passes run inside this context update the parameters; outside it the hooks do nothing."""
        self._enabled = True
        try:
            yield
        finally:
            self._enabled = False

    def remove(self) -> None:
        """Unregister the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _step_parameter(self, param: torch.nn.Parameter) -> None:
        if not self._enabled:
            return
        groups = self.optimizer.param_groups
        all_params = [group["params"] for group in groups]
        target = self._group_index[id(param)]
        for index, group in enumerate(groups):
            group["params"] = [param] if index == target else []
        try:
            self.optimizer.step()
        finally:
            for group, params in zip(groups, all_params):
                group["params"] = params
        param.grad = None
