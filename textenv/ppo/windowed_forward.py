"""The fast forward passes of a PPO step, used when nothing a user can observe depends on full-width logits.

Legacy TRL ran every padded row in full and kept `[B, L, V]` logits. Here the rows of a mini-batch run as one
packed sequence of real tokens with every shared prefix once (`packing`), one pass gives policy
log-probabilities and values, the LM head runs only on the response positions, and log-probabilities are
gathered without a full log-softmax. The results equal ``PPOTrainer.batched_forward_pass``'s on every response
position; outside the responses the log-probabilities are 0 (see docs/guides/porting.md). `PPOTrainer.step`
takes this path unless a subclass overrides ``batched_forward_pass``, ``train_minibatch`` or ``loss``, the model
is an encoder-decoder, or ``kl_penalty="full"`` (which needs full logits). Models that cannot run packed (see
`packing.supports_packing`) and ``PPOConfig(share_prompt_prefix=False)`` run the padded rows, cropped to their
real columns, with the LM head on the response window.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from textenv.ppo import core, packing
from textenv.ppo.batch import PackedBatch

logger = logging.getLogger(__name__)
_warned_padded: set[str] = set()  # reasons already warned about (once per process each)

@dataclass
class PolicyPass:
    """A training forward pass of the policy on some rows, with its autograd graph.

    Attributes:
        rows: the batch rows it ran on (``None``: a mini-batch of the training loop).
        logprobs / entropy / values: `[b, L - 1]`; ``logprobs`` and ``values`` carry gradients.
    """

    rows: np.ndarray | None
    logprobs: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor


def _chunks(rows, size: int, device) -> list[torch.Tensor]:
    rows = list(rows)
    return [torch.as_tensor(rows[begin : begin + size], device=device) for begin in range(0, len(rows), size)]


def response_positions(batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """`(rows, positions)`, each `[K]`: every logprob position that predicts a response token."""
    lengths = batch.ends - batch.starts  # [b]
    rows = torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device), lengths)
    offsets = torch.arange(int(lengths.sum()), device=lengths.device) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
    return rows, batch.starts[rows] + offsets


def kept_entropy(logits: torch.Tensor) -> torch.Tensor:
    """`[K, V]` -> `[K]` entropy of each position's softmax (no gradient), ``core.LOGIT_CHUNK`` positions at a time."""
    with torch.no_grad():
        return torch.cat([core.entropy_from_logits(core.upcast_half(chunk)) for chunk in logits.split(core.LOGIT_CHUNK)])


class WindowedForwardMixin:
    """Forward passes on the response positions of a [`PackedBatch`] (methods of [`PPOTrainer`])."""

    def _forward_kept(self, model, batch: PackedBatch, rows: torch.Tensor, positions: torch.Tensor, layout=None):
        """One forward pass on the real tokens of ``batch`` with the LM head on the given logprob positions only.

        Args:
            layout: the [`packing.PackedRows`] that `_packed_scope` yields (``None``: run the padded rows).

        Returns:
            `(logits, values)`: ``logits`` `[K, V]` of the positions ``(rows, positions)``, ``values``
            `[b, L - 1]` (zero on padding).
        """
        num_positions = batch.num_positions
        if layout is not None:
            computed, copies = layout.token_index[rows, positions].unique(return_inverse=True)  # rows may share a response start
            with self.accelerator.autocast():
                logits, _, values = model(
                    input_ids=layout.input_ids, position_ids=layout.position_ids, logits_to_keep=computed, packed_rows=layout,
                )
            values = core.upcast_half(values)[0, layout.token_index[:, :num_positions]] * layout.real_tokens[:, :num_positions]
            return logits[0][copies], values
        col0, col1 = int(batch.first_token.min()), int(batch.last_token.max())
        window = slice(int(positions.min()) - col0, int(positions.max()) + 1 - col0)
        with self.accelerator.autocast():
            logits, _, values = model(
                input_ids=batch.input_ids[:, col0:col1], attention_mask=batch.attention_mask[:, col0:col1], logits_to_keep=window
            )
        values = F.pad(core.upcast_half(values), (col0, num_positions + 1 - col1))[:, :num_positions]  # [b, L - 1]
        return logits[rows, positions - col0 - window.start], values

    @contextlib.contextmanager
    def _packed_scope(self, model, batch: PackedBatch):
        """Yield ``batch``'s packed layout (``None`` unless ``share_prompt_prefix`` and the model allow packing);
        inside, the model's attention runs per packed segment, forward and backward."""
        causal_lm = getattr(self.accelerator.unwrap_model(model), "causal_lm", None)
        layout = None
        if self.config.share_prompt_prefix and causal_lm is not None:
            reason = packing.packing_unsupported_reason(causal_lm)
            if reason is None:
                layout = packing.plan_packing(batch.input_ids, batch.attention_mask)
                reason = None if layout is not None else "a row's attention mask is not one contiguous run of real tokens"
            if reason is not None:
                _warn_padded(reason)
        if layout is None:
            yield None
            return
        with packing.packed_attention(causal_lm.config):
            yield layout

    def _labels(self, batch: PackedBatch, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return batch.input_ids[rows, positions + 1]  # [K]

    def _place(self, kept_values: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """`[K]` values of the kept positions -> `[b, L - 1]`, zero elsewhere."""
        placed = torch.zeros(batch.input_ids.shape[0], batch.num_positions, dtype=kept_values.dtype, device=kept_values.device)
        return placed.index_put((rows, positions), kept_values)

    def _windowed_experience_forward(
        self, batch: PackedBatch, early_rows: np.ndarray | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, PolicyPass | None]:
        """No-grad passes of the reference and the policy, one mini-batch at a time.

        Args:
            early_rows: the rows of the first training mini-batch, or ``None``. Their policy pass runs with
                gradients, exactly as that mini-batch's training pass would (the weights are still the old
                ones), and is returned to be trained on; their old log-probabilities and values are its values.

        Returns:
            `(logprobs, ref_logprobs, values, policy_pass)`: `[B, L - 1]` each, and the [`PolicyPass`] of
            ``early_rows`` (``None`` without them).
        """
        chunk = self.config.mini_batch_size
        num_rows = batch.input_ids.shape[0]
        dtype = torch.promote_types(next(self.model.parameters()).dtype, torch.float32)  # bf16 -> float32, float64 kept
        logprobs = torch.zeros(num_rows, batch.num_positions, dtype=dtype, device=batch.input_ids.device)
        ref_logprobs, values = torch.zeros_like(logprobs), torch.zeros_like(logprobs)
        early = set() if early_rows is None else set(early_rows.tolist())
        late_rows = [row for row in range(num_rows) if row not in early]
        self.model.eval()  # before the reference pass too: with PEFT the reference is this model
        with self._device_cache_guard():
            with self._reference_context() as reference:
                for index in _chunks(range(num_rows), chunk, logprobs.device):
                    ref_logprobs[index] = self._kept_logprobs_of(reference, batch.select(index))
            for index in _chunks(late_rows, chunk, logprobs.device):
                logprobs[index], values[index] = self._kept_logprobs_of(self.model, batch.select(index), with_values=True)
            policy_pass = None
            if early_rows is not None:
                index = torch.as_tensor(early_rows, device=logprobs.device)
                part = batch.select(index)
                with torch.enable_grad(), self._packed_scope(self.model, part) as layout:
                    policy_pass = self._policy_pass(part, layout, early_rows)
                logprobs[index], values[index] = policy_pass.logprobs.detach(), policy_pass.values.detach()
        return logprobs, ref_logprobs, values, policy_pass

    def _first_minibatch_rows(self) -> np.ndarray | None:
        """The rows of the first training mini-batch, whose policy pass then runs with the experience passes (the
        weights are still the old ones, so it gives their old log-probabilities and values too): on one process
        without gradient accumulation. The permutation is peeked from numpy's global RNG without consuming it;
        `_optimise` draws the same one (if something else drew in between, the early pass is dropped)."""
        config = self.config
        if self.is_distributed or config.gradient_accumulation_steps != 1 or config.ppo_epochs < 1:
            return None
        state = np.random.get_state()
        order = np.random.permutation(config.batch_size)
        np.random.set_state(state)
        return order[: config.mini_batch_size]

    def _take_policy_pass(self, experience: dict, rows: np.ndarray) -> PolicyPass | None:
        """The early pass of `_windowed_experience_forward`, taken out of ``experience`` (only the first
        mini-batch can use it), if ``rows`` are the rows it ran on."""
        policy_pass = experience.pop("policy_pass", None)
        return policy_pass if policy_pass is not None and np.array_equal(policy_pass.rows, rows) else None

    def _response_pass(self, model, part: PackedBatch, layout):
        """``model`` on ``part`` (inside its `_packed_scope`): `(logits, logprobs, values, rows, positions)`,
        ``logits`` `[K, V]` of the response positions ``(rows, positions)``, ``logprobs`` and ``values`` `[b, L - 1]`."""
        rows, positions = response_positions(part)
        logits, values = self._forward_kept(model, part, rows, positions, layout)
        logprobs = self._place(core.selective_logprobs(logits, self._labels(part, rows, positions)), rows, positions, part)
        return logits, logprobs, values, rows, positions

    def _kept_logprobs_of(self, model, part: PackedBatch, with_values: bool = False):
        """`[b, L - 1]` log-probabilities of ``part``'s response tokens under ``model`` (and its values)."""
        with self._packed_scope(model, part) as layout:
            _, logprobs, values, _, _ = self._response_pass(model, part, layout)
        return (logprobs, values) if with_values else logprobs

    def _policy_pass(self, part: PackedBatch, layout, rows: np.ndarray | None) -> PolicyPass:
        """The training forward pass of the policy on ``part`` (inside its `_packed_scope`, gradients on)."""
        self._set_training_forward_mode()
        logits, logprobs, values, kept_rows, positions = self._response_pass(self.model, part, layout)
        return PolicyPass(rows, logprobs, self._place(kept_entropy(logits), kept_rows, positions, part), values)

    def _windowed_train_minibatch(
        self, part: PackedBatch, old_logprobs, old_values, advantages, returns, policy_pass: PolicyPass | None = None,
        importance_weights: torch.Tensor | None = None,
    ) -> dict:
        """`train_minibatch` with its forward pass on the response positions: same loss, statistics and update.
        ``policy_pass``: this mini-batch's forward pass, already run (see `_windowed_experience_forward`);
        ``importance_weights``: see `PPOTrainer.loss`."""
        with self._device_cache_guard(), self._packed_scope(self.model, part) as layout:  # also for recomputation
            if policy_pass is None:
                policy_pass = self._policy_pass(part, layout, None)
            pg_loss, scaled_vf_loss, stats, skipped = core.ppo_losses(
                old_logprobs, old_values, policy_pass.logprobs, policy_pass.values, policy_pass.entropy, part.masks,
                advantages, returns, self.config.cliprange, self.config.cliprange_value, self.config.vf_coef,
                self.config.ratio_threshold, importance_weights,
            )
            if skipped:
                self._warn_ratio_threshold(stats["policy/ratio"], part.masks)
            self.model.train()
            self._apply_gradients(pg_loss + scaled_vf_loss)
            return stats

    def _set_training_forward_mode(self) -> None:
        # No dropout in the forward pass, as legacy TRL (which ran it in eval mode): old and new logprobs then
        # come from the same function of the weights. Gradient checkpointing only runs in train mode, so with
        # it the model is put in train mode with its dropout layers switched off.
        self.model.eval()
        if self.config.gradient_checkpointing:
            self.model.train()
            for module in self.model.modules():
                if isinstance(module, nn.Dropout):
                    module.eval()


def _warn_padded(reason: str) -> None:
    """Say once per reason that the PPO step runs padded rows although ``share_prompt_prefix`` asked for packing."""
    if reason not in _warned_padded:
        _warned_padded.add(reason)
        logger.warning("PPO's forward passes run the padded rows, not packed ones (share_prompt_prefix=True): %s. Cost: every "
                       "row's prompt is computed once per row and padding columns run too (slower on batches that share "
                       "a prompt). PPOConfig(share_prompt_prefix=False) asks for this path and silences this warning.", reason)
