"""GRPOTrainer: Group Relative Policy Optimisation one ``step(queries, responses, scores, masks)`` at a time.

The same episodes and masks as `PPOTrainer.step`, a plain causal LM (no value head; LoRA allowed), and TRL
1.16's GRPO formulas (`textenv.grpo.core`). One step, top to bottom:

1. rewards `[B]` -> group-relative advantages `[B]` (groups: consecutive runs of ``num_generations``);
2. the rows padded as TRL does (`textenv.grpo.batch`); truncated episodes masked out on request;
3. off-policy only (several optimizer steps or passes per batch, or the decoupled objective): the old
   log-probabilities, without gradient; ``beta > 0`` only: the reference's log-probabilities;
4. ``num_iterations`` passes over shuffled mini-batches: clipped per-token loss (times the off-policy correction's
   importance weights, `textenv.off_policy`, when it is on) (+ beta * KL), aggregated per
   ``loss_type``, gradients accumulated over ``gradient_accumulation_steps`` mini-batches, clipped, one
   optimizer step;
5. statistics: reward and advantage per group, clip fractions, entropy, KL, importance weights, timings.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from typing import Sequence

import torch
from torch import nn

from textenv import off_policy
from textenv.grpo import core
from textenv.grpo.batch import GroupBatch, pad_group_batch, pad_rollout_logprobs, response_logprobs
from textenv.grpo.config import GRPOConfig
from textenv.padding import pad_token_id
from textenv.ppo import packing
from textenv.ppo.checkpoint import TrainerSaving
from textenv.ppo.core import upcast_half
from textenv.ppo.reference_model import create_reference_model
from textenv.ppo.step_stats import StepStatisticsMixin
from textenv.ppo.trainer_setup import default_optimizer, init_trackers, is_value_head_model, make_accelerator


class GRPOTrainer(TrainerSaving):
    """Group Relative Policy Optimisation on given (query, response, score) triples, one ``step`` at a time.

    Args:
        config (`GRPOConfig`, *optional*): the settings; default `GRPOConfig()`.
        model (`transformers.PreTrainedModel` or `peft.PeftModel`): the policy, a plain causal LM.
        ref_model (`nn.Module`, *optional*): the frozen reference of the KL term; only used with ``beta > 0``.
            `None`: the model with its adapters disabled (PEFT) or a frozen copy. With ``beta == 0`` no
            reference is loaded.
        tokenizer (*optional*): the pad token of the batches; saved with the model.
        optimizer (`torch.optim.Optimizer`, *optional*): default Adam over the trainable parameters (fused where
            torch has it) at ``config.learning_rate``.
        lr_scheduler (*optional*): stepped after every optimizer step.

    Attributes:
        accelerator (`accelerate.Accelerator`): the accelerator that prepared the model and optimizer.
        current_step (`int`): the optimizer steps done; `model`, `optimizer` and `ref_model` are the arguments.
    """

    log_stats = StepStatisticsMixin.log_stats

    def __init__(self, config: GRPOConfig | None = None, model: nn.Module | None = None, ref_model: nn.Module | None = None,
                 tokenizer=None, optimizer: torch.optim.Optimizer | None = None, lr_scheduler=None):
        config = config if config is not None else GRPOConfig()
        _check_constructor_args(config, model)
        from accelerate.utils import set_seed

        self.config = config
        set_seed(config.seed)
        self.accelerator = make_accelerator(config, gradient_accumulation_steps=1)  # we accumulate by hand (see _optimise)
        self.tokenizer = tokenizer
        self.pad_token_id = pad_token_id(tokenizer, model)
        self.is_peft_model = hasattr(model, "disable_adapter") and hasattr(model, "peft_config")
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.ref_model = self._build_reference(model, ref_model)
        if optimizer is None:
            optimizer = default_optimizer([p for p in model.parameters() if p.requires_grad], config.learning_rate)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.lr_scheduler = self.accelerator.prepare(lr_scheduler) if lr_scheduler is not None else None
        if self.ref_model is not None:
            self.ref_model = self.ref_model.to(self.accelerator.device)
        self.trainable_params = [p for p in self.model.parameters() if p.requires_grad]
        self.packed_config = packed_config(self.accelerator.unwrap_model(self.model), config.share_prompt_prefix)
        self.current_device = self.accelerator.device
        self.current_step = 0
        if config.log_with is not None:
            init_trackers(self.accelerator, config)

    def _build_reference(self, model: nn.Module, ref_model: nn.Module | None) -> nn.Module | None:
        if self.config.beta == 0.0:
            if ref_model is not None:
                warnings.warn("ref_model is not used with beta=0 (no KL term): it is ignored.", UserWarning, stacklevel=3)
            return None
        if ref_model is not None:
            for param in ref_model.parameters():
                param.requires_grad_(False)
            return ref_model.eval()
        return None if self.is_peft_model else create_reference_model(model)

    # ---------------------------------------------------------------------------------------------
    # step
    # ---------------------------------------------------------------------------------------------
    def step(
        self,
        queries: Sequence[torch.Tensor],
        responses: Sequence[torch.Tensor],
        scores: Sequence[torch.Tensor],
        response_masks: Sequence[torch.Tensor] | None = None,
        truncated: Sequence[bool] | None = None,
        rollout_logprobs: Sequence[torch.Tensor] | None = None,
    ) -> dict:
        """Optimise the policy on one batch of episodes, whole groups of ``num_generations`` in order.

        Args:
            queries (`list[torch.LongTensor]`): `B` query token ids (prompt and task).
            responses (`list[torch.LongTensor]`): `B` response token ids (model and tool tokens interleaved).
            scores (`list[torch.Tensor]`): `B` scalar rewards; episodes ``[g * G, (g + 1) * G)`` are group `g`.
            response_masks (`list[torch.Tensor]`, *optional*): 1 on response tokens the model wrote, 0 on tool and
                observation tokens (only the 1s are trained); `None`: every response token.
            truncated (`list[bool]`, *optional*): episodes a limit ended; with ``mask_truncated_completions`` they
                are not trained on (they still count in their group's advantage, as in TRL).
            rollout_logprobs (`list[torch.Tensor]`, *optional*): `B` 1-D float tensors of each response's length,
                the inference engine's log-probability of every response token (anything, e.g. NaN, on mask-0
                tokens), e.g. ``history.response_logprobs()``. Required with
                ``config.vllm_importance_sampling_correction`` (see `textenv.off_policy`); ignored without it.

        Returns:
            `dict` of statistics (see the module docstring), tensors and numpy arrays; with the correction also
            ``objective/importance_sampling_ratio_mean``, ``..._ratio_max``, ``..._clipped_frac`` and ``..._masked_frac``.
        """
        config, started = self.config, time.perf_counter()
        _check_step_args(config, queries, responses, scores, response_masks, truncated)
        if config.vllm_importance_sampling_correction:
            rollout_logprobs = off_policy.check_rollout_logprobs(rollout_logprobs, responses, response_masks, "GRPOConfig")
        device = self.accelerator.device
        rewards = torch.stack([torch.as_tensor(score, dtype=torch.float32).reshape(()) for score in scores]).to(device)
        if not torch.isfinite(rewards).all():
            raise ValueError(f"scores must be finite numbers; got {rewards.tolist()} (score a failed episode, or leave it out with its group).")
        all_rewards = self.accelerator.gather(rewards) if config.scale_rewards == "batch" else None
        advantages, std_rewards = core.group_advantages(rewards, config.num_generations, config.scale_rewards, all_rewards)
        batch = pad_group_batch(queries, responses, response_masks, self.pad_token_id, device)
        truncated_rows = torch.tensor([bool(t) for t in truncated], device=device) if truncated is not None else None
        if config.mask_truncated_completions and truncated_rows is not None:
            batch.loss_mask[truncated_rows] = 0.0

        timings = {}
        old_logprobs = self._logprobs_without_grad(self.model, batch, timings, "old_logprobs") if config.computes_old_logprobs else None
        ref_logprobs = self._reference_logprobs(batch, timings) if config.beta > 0 else None
        rollout = pad_rollout_logprobs(rollout_logprobs, batch) if config.vllm_importance_sampling_correction else None
        optimise_started = time.perf_counter()
        totals = self._optimise(batch, advantages, old_logprobs, ref_logprobs, rollout)
        timings["optimise"] = time.perf_counter() - optimise_started
        self.current_step += 1

        stats = self._step_stats(rewards, advantages, std_rewards, batch, totals, truncated_rows)
        if "importance" in totals:
            stats.update({name: value.item() for name, value in totals["importance"].reduced(self.accelerator).stats().items()})
        stats.update({f"time/grpo/{name}": seconds for name, seconds in timings.items()})
        stats["time/grpo/total"] = time.perf_counter() - started
        return stats

    def _logprobs_without_grad(self, model, batch: GroupBatch, timings: dict, name: str) -> torch.Tensor:
        """`[B, T]` log-probabilities of the responses under `model`, mini-batch by mini-batch, without gradient."""
        started, was_training = time.perf_counter(), model.training
        model.eval()
        rows = torch.arange(len(batch.prompt_ids), device=batch.prompt_ids.device)
        chunks = []
        with torch.no_grad(), self.accelerator.autocast():
            for start in range(0, len(rows), self.config.mini_batch_size):
                part = batch.select(rows[start : start + self.config.mini_batch_size])
                logprobs, _ = response_logprobs(model, part, self.config.temperature, packed_config=self._packed_config_of(model))
                chunks.append(upcast_half(logprobs))  # bf16/fp16 -> float32; a float64 model stays float64
        model.train(was_training)
        timings[name] = time.perf_counter() - started
        return torch.cat(chunks)

    def _packed_config_of(self, model) -> object | None:
        """The config to pack ``model``'s rows with: the policy's, or a separate reference's own."""
        if model is self.model:
            return self.packed_config
        return packed_config(model, self.config.share_prompt_prefix)

    def _reference_logprobs(self, batch: GroupBatch, timings: dict) -> torch.Tensor:
        if self.ref_model is not None:
            return self._logprobs_without_grad(self.ref_model, batch, timings, "reference")
        with self.accelerator.unwrap_model(self.model).disable_adapter():
            return self._logprobs_without_grad(self.model, batch, timings, "reference")

    def _optimise(self, batch: GroupBatch, advantages: torch.Tensor, old_logprobs, ref_logprobs, rollout_logprobs) -> dict:
        """``num_iterations`` passes of mini-batches with an optimizer step every ``gradient_accumulation_steps``;
        ``rollout_logprobs``: `[B, T]` (`pad_rollout_logprobs`) with the off-policy correction, else `None`."""
        config = self.config
        accumulation = config.gradient_accumulation_steps
        tokens = self.accelerator.reduce(batch.loss_mask.sum(), reduction="sum").item()
        tokens_per_optimizer_step = core.dapo_divisor(tokens, self.accelerator.num_processes, accumulation, config.mini_batches)
        max_completion_length = config.max_completion_length or batch.completion_ids.shape[1]
        order = torch.randperm(len(advantages), device=advantages.device)  # one shuffle per batch, as TRL's buffer
        totals = dict.fromkeys(("tokens", "entropy", "kl", "low", "high", "region"), 0.0)
        totals["losses"] = []
        self.model.train()
        for _ in range(config.num_iterations):
            for index in range(config.mini_batches):
                rows = order[index * config.mini_batch_size : (index + 1) * config.mini_batch_size]
                closes_window = (index + 1) % accumulation == 0
                sync = contextlib.nullcontext() if closes_window else self.accelerator.no_sync(self.model)
                with sync, self.accelerator.autocast():
                    loss = self._mini_batch_loss(batch.select(rows), rows, advantages, (old_logprobs, ref_logprobs, rollout_logprobs), totals,
                                                 accumulation_steps=accumulation, max_completion_length=max_completion_length,
                                                 tokens_per_optimizer_step=tokens_per_optimizer_step)
                    self.accelerator.backward(loss)
                totals["window_loss"] = totals.get("window_loss", 0.0) + loss.item()
                if closes_window:
                    self._optimizer_step()
                    totals["losses"].append(totals.pop("window_loss"))
        return totals

    def _mini_batch_loss(self, mini_batch: GroupBatch, rows, advantages, batch_logprobs: tuple, totals: dict, **aggregation) -> torch.Tensor:
        """The mini-batch's loss; ``batch_logprobs``: the batch's `[B, T]` old, reference and rollout
        log-probabilities (each `None` when the step has none)."""
        config = self.config
        old_logprobs, ref_logprobs, rollout_logprobs = batch_logprobs
        logprobs, entropies = response_logprobs(self.model, mini_batch, config.temperature, with_entropy=True, packed_config=self.packed_config)
        old = logprobs.detach() if old_logprobs is None else old_logprobs[rows]
        mask = mini_batch.loss_mask
        weights = self._importance_weights(old, rollout_logprobs[rows], mask, totals) if rollout_logprobs is not None else None
        per_token_loss, ratio = core.clipped_token_loss(logprobs, old, advantages[rows], config.epsilon_low, config.upper_epsilon, weights)
        if ref_logprobs is not None:
            per_token_kl = core.reference_kl(logprobs, ref_logprobs[rows], ratio if config.use_bias_correction_kl else None)
            per_token_loss = per_token_loss + config.beta * per_token_kl
            totals["kl"] += (per_token_kl.detach() * mask).sum().item()
        totals["tokens"] += mask.sum().item()
        totals["entropy"] += (entropies * mask).sum().item()
        for name, clipped in core.clip_fractions(ratio.detach(), advantages[rows], mask, config.epsilon_low, config.upper_epsilon).items():
            totals[name] += clipped.item()
        return core.aggregate_loss(per_token_loss, mask, config.loss_type, **aggregation)

    def _importance_weights(self, old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, totals: dict) -> torch.Tensor:
        """The mini-batch's `[mb, T]` importance weights (`textenv.off_policy`); their tally joins ``totals``."""
        weights, tally = off_policy.importance_weights(old, rollout, mask, off_policy.correction_of(self.config))
        totals["importance"] = totals["importance"] + tally if "importance" in totals else tally
        return weights

    def _optimizer_step(self) -> None:
        if self.config.max_grad_norm is not None and self.accelerator.sync_gradients:
            self.accelerator.clip_grad_norm_(self.trainable_params, self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    def _step_stats(self, rewards, advantages, std_rewards, batch: GroupBatch, totals: dict, truncated_rows) -> dict:
        config = self.config
        sums = torch.tensor([totals[name] for name in ("tokens", "entropy", "kl", "low", "high", "region")], device=rewards.device)
        trained, entropy, kl, low, high, region = self.accelerator.reduce(sums, reduction="sum").tolist()
        tokens = max(trained, 1.0)  # the divisor of the per-token means
        grouped = rewards.view(-1, config.num_generations)
        return {
            "objective/kl": kl / tokens if config.beta > 0 else float("nan"),
            "objective/kl_coef": config.beta,
            "objective/entropy": entropy / tokens,
            "grpo/loss/policy": sum(totals["losses"]) / max(len(totals["losses"]), 1),
            "grpo/clip_ratio/low_mean": low / tokens,
            "grpo/clip_ratio/high_mean": high / tokens,
            "grpo/clip_ratio/region_mean": region / tokens,
            "grpo/rewards/mean": rewards.mean().item(),
            "grpo/rewards/std": rewards.std().item() if rewards.numel() > 1 else 0.0,
            "grpo/rewards/group_mean": grouped.mean(dim=1).cpu(),
            "grpo/rewards/group_std": grouped.std(dim=1).cpu() if config.num_generations > 1 else torch.zeros(len(grouped)),
            "grpo/frac_reward_zero_std": torch.isclose(std_rewards, torch.zeros_like(std_rewards)).float().mean().item(),
            "grpo/advantages": advantages.cpu(),
            "grpo/advantages/mean": advantages.mean().item(),
            "grpo/advantages/abs_mean": advantages.abs().mean().item(),
            "grpo/learning_rate": self.optimizer.param_groups[0]["lr"],
            "grpo/truncated": int(truncated_rows.sum().item()) if truncated_rows is not None else 0,
            "tokens/queries_len_mean": batch.prompt_mask.sum(1).float().mean().item(),
            "tokens/responses_len_mean": batch.completion_mask.sum(1).float().mean().item(),
            "tokens/trained": trained / config.num_iterations,
        }


def packed_config(model: nn.Module, share_prompt_prefix: bool):
    """The transformers config of ``model``'s causal LM when its rows may run packed (`textenv.ppo.packing`),
    else `None`. A PEFT model runs packed through its base model's attention layers."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not share_prompt_prefix:
        return None
    reason = packing.packing_unsupported_reason(base)
    if reason is not None:
        warnings.warn(
            f"GRPOConfig(share_prompt_prefix=True) but this model cannot run packed ({reason}; see "
            "textenv.ppo.packing.packing_unsupported_reason): its mini-batches run padded, every row's whole prompt through the "
            "model (about 2x slower steps on long shared prompts). trainer.packed_config is None.",
            stacklevel=3,
        )
        return None
    return base.config


def _check_constructor_args(config, model) -> None:
    if not isinstance(config, GRPOConfig):
        raise ValueError(f"config must be a GRPOConfig, got {type(config).__name__}.")
    if model is None or not isinstance(model, nn.Module):
        raise ValueError(f"model must be a causal LM (transformers or peft), got {type(model).__name__}.")
    if is_value_head_model(model):
        raise ValueError(
            "GRPO trains a plain causal LM, without a value head: pass model.pretrained_model (or load the policy "
            "with textenv.training.load_policy(..., value_head=False))."
        )


def _check_step_args(config: GRPOConfig, queries, responses, scores, response_masks, truncated) -> None:
    lengths = {"queries": len(queries), "responses": len(responses), "scores": len(scores)}
    if response_masks is not None:
        lengths["response_masks"] = len(response_masks)
    if truncated is not None:
        lengths["truncated"] = len(truncated)
    if set(lengths.values()) != {config.batch_size}:
        raise ValueError(f"step needs config.batch_size ({config.batch_size}) of each, got {lengths}.")
    for name, tensors in (("queries", queries), ("responses", responses)):
        for index, tensor in enumerate(tensors):
            if not isinstance(tensor, torch.Tensor) or tensor.dim() != 1 or len(tensor) == 0:
                raise ValueError(f"{name}[{index}] must be a non-empty 1-D tensor of token ids.")
    if response_masks is not None:
        for index, (mask, response) in enumerate(zip(response_masks, responses)):
            if mask.shape != response.shape:
                raise ValueError(f"response_masks[{index}] has shape {tuple(mask.shape)}, responses[{index}] {tuple(response.shape)}.")
