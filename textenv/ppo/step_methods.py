"""The pieces of one PPO step that legacy TRL let subclasses override, with legacy's names, arguments and shapes.

`PPOTrainer.step` calls each of them; override one to change what `step` does (dense rewards through
``compute_rewards``, a custom ``loss`` ...). Conventions: ``B`` rows, ``T = L - 1`` logprob positions (position
``t`` predicts token ``t + 1``), ``V`` vocabulary.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import torch
from torch import nn

from textenv.ppo import core
from textenv.ppo.inputs import check_step_inputs
from textenv.padding import left_pad, right_pad

# Methods whose override makes `step` run the legacy forward passes (they see full-width logits).
FORWARD_HOOKS = ("batched_forward_pass", "train_minibatch", "loss")


class PPOStepMethods:
    """Safety checks, model inputs, forward passes, rewards, advantages, loss and mini-batch update of
    [`PPOTrainer`]."""

    def _step_safety_checker(
        self,
        batch_size: int | None,
        queries: Sequence[torch.LongTensor],
        responses: Sequence[torch.LongTensor],
        scores: Sequence[torch.Tensor],
        masks: Sequence[torch.Tensor] | None = None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor] | None]:
        """Check the inputs of `step` (``ValueError`` naming the argument and index) and move them to the device.

        Returns:
            `(queries, responses, scores, masks)`: lists of 1-D LongTensors, of 0-d float scores (a `[1]` score is
            squeezed) and of 1-D float masks (or ``None``).
        """
        queries, responses, scores, masks = check_step_inputs(queries, responses, scores, masks, batch_size, self._vocab_size())
        device = self.current_device
        return (
            [query.to(device) for query in queries],
            [response.to(device) for response in responses],
            list(scores.to(device)),
            [mask.to(device) for mask in masks] if masks is not None else None,
        )

    def _vocab_size(self) -> int | None:
        embeddings = self.accelerator.unwrap_model(self.model).pretrained_model.get_input_embeddings()
        return getattr(embeddings, "num_embeddings", None)

    def prepare_model_inputs(self, queries: list[torch.Tensor], responses: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Pad the model inputs of a batch (the tokenizer's padding side, or ``training_data_collator``).

        Returns:
            Decoder-only: ``input_ids`` and ``attention_mask`` `[B, L]` of each query followed by its response.
            Encoder-decoder: the queries as ``input_ids`` / ``attention_mask`` and the responses as
            ``decoder_input_ids`` / ``decoder_attention_mask``.
        """
        if self.is_encoder_decoder:
            inputs = self._pad_rows(queries)
            decoder_inputs = self._pad_rows(responses)
            inputs["decoder_input_ids"] = decoder_inputs["input_ids"]
            inputs["decoder_attention_mask"] = decoder_inputs["attention_mask"]
            return inputs
        return self._pad_rows([torch.cat([query, response]) for query, response in zip(queries, responses)])

    def _pad_rows(self, rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.training_data_collator is not None:
            padded = self.training_data_collator([{"input_ids": row, "attention_mask": torch.ones_like(row)} for row in rows])
            return {key: padded[key].to(self.current_device) for key in ("input_ids", "attention_mask")}
        if self._pads_left():
            input_ids, attention_mask = left_pad(rows, self.pad_token_id)
        else:
            input_ids, attention_mask = right_pad(rows, self.pad_token_id), right_pad([torch.ones_like(row) for row in rows], 0)
        return {"input_ids": input_ids.to(self.current_device), "attention_mask": attention_mask.to(self.current_device)}

    def _pads_left(self) -> bool:
        return getattr(self.tokenizer, "padding_side", "right") == "left"

    def _pad_across_processes(self, model_inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self.is_distributed:
            return model_inputs
        padded = {}
        for key, value in model_inputs.items():
            pad_index = 0 if key.endswith("attention_mask") else self.pad_token_id
            padded[key] = self.accelerator.pad_across_processes(value, dim=1, pad_index=pad_index, pad_first=self._pads_left())
        return padded

    def batched_forward_pass(
        self,
        model: nn.Module,
        queries: list[torch.Tensor],
        responses: list[torch.Tensor],
        model_inputs: dict[str, torch.Tensor],
        return_logits: bool = False,
        response_masks: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """Forward passes in chunks of ``mini_batch_size`` (``model`` in eval mode), as legacy TRL ran them.

        Returns:
            `(logprobs, logits, values, masks)`: `[B, L - 1]` log-probability of each next token, `[B, L - 1, V]`
            logits if ``return_logits`` else ``None``, `[B, L - 1]` values, and `[B, L - 1]` masks that are 1 on
            the positions predicting a response token (times ``response_masks``).
        """
        chunk = self.config.mini_batch_size
        all_logprobs, all_logits, all_values, all_masks = [], [], [], []
        model.eval()
        for begin in range(0, len(queries), chunk):
            inputs = {key: value[begin : begin + chunk] for key, value in model_inputs.items()}
            logits, _, values = model(**inputs)
            prefix = "decoder_" if self.is_encoder_decoder else ""
            input_ids, attention_mask = inputs[prefix + "input_ids"], inputs[prefix + "attention_mask"]
            logprobs = core.logprobs_from_logits(logits[:, :-1, :], input_ids[:, 1:])
            masks = torch.zeros_like(attention_mask)
            masks[:, :-1] = attention_mask[:, 1:]
            for row in range(len(input_ids)):
                index = begin + row
                if self.is_encoder_decoder:
                    start, end = 1, int(attention_mask[row].sum()) - 1  # the decoder starts after its start token
                else:
                    start = len(queries[index]) - 1 + int(attention_mask[row].nonzero()[0])  # after left padding
                    end = start + len(responses[index])
                masks[row, :start] = 0
                masks[row, end:] = 0
                if response_masks is not None:
                    masks[row, start:end] = masks[row, start:end] * response_masks[index]
            all_logits.append(logits if return_logits else None)
            del logits
            all_logprobs.append(logprobs)
            all_values.append(values)
            all_masks.append(masks)
        return (
            torch.cat(all_logprobs),
            torch.cat(all_logits)[:, :-1] if return_logits else None,
            torch.cat(all_values)[:, :-1],
            torch.cat(all_masks)[:, :-1],
        )

    def compute_rewards(
        self, scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-token rewards: ``-kl_coef * _kl_penalty`` everywhere, plus each score on its row's last trainable
        position.

        Returns:
            `(rewards, non_score_rewards, kls)`, each `[B, T]`.
        """
        kls = torch.stack([self._kl_penalty(logprob, ref_logprob) for logprob, ref_logprob in zip(logprobs, ref_logprobs)])
        rewards, non_score_rewards = core.compute_rewards(scores, kls, masks, self.kl_ctl.value)
        return rewards, non_score_rewards, kls

    def _kl_penalty(self, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        """``config.kl_penalty`` of one row (see `core.kl_penalty`)."""
        return core.kl_penalty(logprob, ref_logprob, self.config.kl_penalty)

    def compute_advantages(
        self, values: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GAE with ``config.gamma`` / ``config.lam`` (see `core.compute_advantages`): `(values, advantages, returns)`."""
        return core.compute_advantages(values, rewards, mask, self.config.gamma, self.config.lam, self.config.whiten_rewards)

    def train_minibatch(
        self,
        old_logprobs: torch.Tensor,
        values: torch.Tensor,
        logprobs: torch.Tensor,
        logits: torch.Tensor,
        vpreds: torch.Tensor,
        mask: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        importance_weights: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """`loss`, backward, (clipping,) optimizer step and ``zero_grad`` on one mini-batch; returns its statistics.
        ``importance_weights`` (`[mb, T]`, optional): see `loss`."""
        with self._device_cache_guard():
            self.model.train()
            weights = {"importance_weights": importance_weights} if importance_weights is not None else {}
            pg_loss, scaled_vf_loss, train_stats = self.loss(old_logprobs, values, logits, vpreds, logprobs, mask, advantages, returns, **weights)
            self._apply_gradients(pg_loss + scaled_vf_loss)
            return train_stats

    def loss(
        self,
        old_logprobs: torch.Tensor,
        values: torch.Tensor,
        logits: torch.Tensor,
        vpreds: torch.Tensor,
        logprobs: torch.Tensor,
        mask: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        importance_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """The clipped PPO losses of a mini-batch (all `[mb, T]`, ``logits`` `[mb, T, V]`); ``importance_weights``
        (optional, `[mb, T]`) multiply each token's policy-gradient term (`textenv.ppo.rollout_correction`).

        Returns:
            `(pg_loss, vf_coef * vf_loss, stats)`; both losses are multiplied by 0 (with a warning) when the
            masked mean ratio exceeds ``config.ratio_threshold``.
        """
        entropy = core.entropy_from_logits(logits)
        pg_loss, scaled_vf_loss, stats, skipped = core.ppo_losses(
            old_logprobs, values, logprobs, vpreds, entropy, mask, advantages, returns,
            self.config.cliprange, self.config.cliprange_value, self.config.vf_coef, self.config.ratio_threshold,
            importance_weights,
        )
        if skipped:
            self._warn_ratio_threshold(stats["policy/ratio"], mask)
        return pg_loss, scaled_vf_loss, stats

    def _warn_ratio_threshold(self, ratio: torch.Tensor, mask: torch.Tensor) -> None:
        warnings.warn(
            f"The average ratio of batch ({core.masked_mean(ratio, mask):.2f}) exceeds threshold "
            f"{self.config.ratio_threshold:.2f}. Skipping batch.",
            UserWarning,
            stacklevel=3,
        )

    def _early_stop(self, policykl: torch.Tensor) -> bool:
        """Whether the policy KL of the last mini-batch (averaged over processes) exceeds ``1.5 * target_kl``; if so
        the gradients are zeroed and the remaining epochs skipped."""
        policykl = policykl.detach().clone().float().to(self.current_device)
        if self.is_distributed:
            policykl = self.accelerator.reduce(policykl, reduction="mean")
        if policykl > 1.5 * self.config.target_kl:
            self.optimizer.zero_grad()
            return True
        return False

    def _scale_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """Scores divided by their running std (minus the running mean with ``use_score_norm``) when
        ``use_score_scaling``, then clipped to ``[-score_clip, score_clip]``."""
        config = self.config
        if config.use_score_scaling:
            self.running.update(scores)
            factor = self.running.std + torch.finfo(scores.dtype).eps
            if config.use_score_norm:
                scores = (scores - self.running.mean) / factor
            else:
                scores = scores / factor
        if config.score_clip is not None:
            scores = torch.clip(scores.float(), -config.score_clip, config.score_clip).to(scores.dtype)
        return scores
