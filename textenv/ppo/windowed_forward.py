"""The fast forward passes of a PPO step, used when nothing a user can observe depends on full-width logits.

Legacy TRL ran every row in full and kept `[B, L, V]` logits. Here one pass gives policy log-probabilities and
values, the LM head runs only on the response window of each mini-batch, log-probabilities are gathered without a
full log-softmax, and rows that share a prompt run it once (`shared_prefix`). The results equal
``PPOTrainer.batched_forward_pass``'s on every response position; outside the responses the log-probabilities
are 0 (see the README's porting notes). `PPOTrainer.step` takes this path unless a subclass overrides
``batched_forward_pass``, ``train_minibatch`` or ``loss``, the model is an encoder-decoder, or
``kl_penalty="full"`` (which needs full logits).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from textenv.ppo import core, shared_prefix
from textenv.ppo.batch import PackedBatch
from textenv.ppo.shared_prefix import PrefixPacking


def _rowwise_entropy(logits: torch.Tensor) -> torch.Tensor:
    """`[b, W, V]` -> `[b, W]` entropy, one row at a time to bound the temporary softmax."""
    return torch.stack([core.entropy_from_logits(row.float()) for row in logits])


class WindowedForwardMixin:
    """Forward passes on the response window of a [`PackedBatch`] (methods of [`PPOTrainer`])."""

    def _forward_window(self, model, batch: PackedBatch):
        """One forward pass on the real tokens of ``batch`` with the LM head on the response window.

        Returns:
            `(logits, values, window)`: ``logits`` `[b, W, V]` for logprob positions ``window``
            (``slice(w0, w1)`` in full-batch coordinates), ``values`` `[b, L - 1]` (zero on padding that
            did not run through the model).
        """
        window = slice(int(batch.starts.min()), int(batch.ends.max()))
        packing, mask_format = self._prefix_packing(model, batch)
        if packing is not None:
            return self._forward_packed(model, batch, packing, mask_format, window)
        col0, col1 = int(batch.first_token.min()), int(batch.last_token.max())
        input_ids = batch.input_ids[:, col0:col1]
        attention_mask = batch.attention_mask[:, col0:col1]
        with self.accelerator.autocast():
            logits, _, values = model(
                input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=slice(window.start - col0, window.stop - col0)
            )
        num_positions = batch.num_positions
        values = F.pad(values.float(), (col0, num_positions + 1 - col1))[:, :num_positions]  # [b, L - 1]
        return logits, values, window

    def _prefix_packing(self, model, batch: PackedBatch) -> tuple[PrefixPacking | None, str | None]:
        if not self.config.share_prompt_prefix:
            return None, None
        mask_format = shared_prefix.mask_format(self.accelerator.unwrap_model(model).config)
        if mask_format is None:
            return None, None
        return shared_prefix.plan_prefix_packing(batch.input_ids, batch.attention_mask), mask_format

    def _forward_packed(self, model, batch: PackedBatch, packing: PrefixPacking, mask_format: str, window: slice):
        """`_forward_window` on the rows packed around their shared prompt prefix (same outputs)."""
        num_rows, num_positions = batch.input_ids.shape[0], batch.num_positions
        dtype = next(self.accelerator.unwrap_model(model).parameters()).dtype
        kept = packing.token_index[:, window]  # [b, W] packed index of each window position
        with self.accelerator.autocast():
            logits, _, values = model(
                input_ids=packing.input_ids,
                attention_mask=packing.attention_mask(mask_format, dtype),
                position_ids=packing.position_ids,
                logits_to_keep=kept.reshape(-1),
            )
        logits = logits.view(num_rows, kept.shape[1], -1)  # [b, W, V]
        index = packing.token_index[:, :num_positions]
        values = values.float()[0, index] * packing.real_tokens[:, :num_positions]  # [b, L - 1]
        return logits, values, window

    def _labels(self, batch: PackedBatch, window: slice) -> torch.Tensor:
        return batch.input_ids[:, window.start + 1 : window.stop + 1]  # [b, W]

    def _place(self, window_values: torch.Tensor, window: slice, num_positions: int) -> torch.Tensor:
        """`[b, W]` values of the window -> `[b, L - 1]`, zero outside the window."""
        return F.pad(window_values, (window.start, num_positions - window.stop))

    def _windowed_experience_forward(self, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """No-grad passes of the policy and the reference, one mini-batch at a time.

        Returns:
            `(logprobs, ref_logprobs, values)`, each `[B, L - 1]`.
        """
        chunk = self.config.mini_batch_size
        num_positions = batch.num_positions
        outputs = {"logprobs": [], "ref_logprobs": [], "values": []}
        self.model.eval()
        with self._device_cache_guard():
            for begin in range(0, batch.input_ids.shape[0], chunk):
                part = batch.select(slice(begin, begin + chunk))
                logits, values, window = self._forward_window(self.model, part)
                labels = self._labels(part, window)
                logprobs = core.selective_logprobs(logits, labels)
                del logits
                with self._reference_context() as reference:
                    ref_logits, _, _ = self._forward_window(reference, part)
                ref_logprobs = core.selective_logprobs(ref_logits, labels)
                del ref_logits
                outputs["logprobs"].append(self._place(logprobs, window, num_positions))
                outputs["ref_logprobs"].append(self._place(ref_logprobs, window, num_positions))
                outputs["values"].append(values)
        return tuple(torch.cat(outputs[key]) for key in ("logprobs", "ref_logprobs", "values"))

    def _windowed_train_minibatch(self, part: PackedBatch, old_logprobs, old_values, advantages, returns) -> dict:
        """`train_minibatch` with its forward pass on the response window: same loss, statistics and update."""
        with self._device_cache_guard():
            self._set_training_forward_mode()
            num_positions = part.num_positions
            logits, vpreds, window = self._forward_window(self.model, part)
            logprobs = self._place(core.selective_logprobs(logits, self._labels(part, window)), window, num_positions)
            with torch.no_grad():
                entropy = self._place(_rowwise_entropy(logits), window, num_positions)
            del logits
            pg_loss, scaled_vf_loss, stats, skipped = core.ppo_losses(
                old_logprobs, old_values, logprobs, vpreds, entropy, part.masks, advantages, returns,
                self.config.cliprange, self.config.cliprange_value, self.config.vf_coef, self.config.ratio_threshold,
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
