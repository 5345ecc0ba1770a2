"""PPOTrainer: the legacy step-based PPO loop (``step(queries, responses, scores, masks)``) on accelerate.

`step` runs legacy TRL's (v0.11.4) algorithm and calls its overridable methods: ``_step_safety_checker``,
``prepare_model_inputs``, ``batched_forward_pass``, ``compute_rewards`` (-> ``_kl_penalty``),
``compute_advantages``, ``train_minibatch`` (-> ``loss``), ``_early_stop`` and ``record_step_stats``. When a
subclass keeps the forward-pass methods as they are (``batched_forward_pass``, ``train_minibatch``, ``loss``),
`step` computes the same values on the faster path of `textenv.ppo.windowed_forward` (rows packed without
padding, LM head on response positions). The optimizer is a fused Adam where torch has one; on CPU the reference copy lives
in a memory-mapped file (`offloaded_reference`); ``PPOConfig.step_in_backward`` (opt-in) steps each parameter
during backward.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from textenv.ppo import core
from textenv.ppo.batch import pack_batch
from textenv.ppo.checkpoint import TrainerSaving
from textenv.ppo.config import PPOConfig
from textenv.ppo.generation import PPOGenerationMixin
from textenv.ppo.kl_control import AdaptiveKLController, FixedKLController, RunningMoments
from textenv.ppo.offloaded_reference import OffloadedReference
from textenv.ppo.rollout_correction import RolloutCorrectionMixin
from textenv.ppo.step_methods import FORWARD_HOOKS, PPOStepMethods
from textenv.ppo.step_stats import StepStatisticsMixin, stack_train_stats
from textenv.ppo.trainer_setup import (
    build_reference,
    check_constructor_args,
    configure_deepspeed,
    default_optimizer,
    empty_device_cache,
    init_trackers,
    make_accelerator,
    make_dataloader,
    make_step_in_backward,
    prepare_reference,
)
from textenv.padding import pad_token_id
from textenv.ppo.utils import convert_to_scalar, stats_to_np
from textenv.ppo.windowed_forward import WindowedForwardMixin

class PPOTrainer(PPOStepMethods, WindowedForwardMixin, StepStatisticsMixin, PPOGenerationMixin, RolloutCorrectionMixin, TrainerSaving):
    """Proximal Policy Optimisation on given (query, response, score) triples, one ``step`` at a time.

    Args:
        config: a [`PPOConfig`].
        model: the policy, an [`AutoModelForCausalLMWithValueHead`] or [`AutoModelForSeq2SeqLMWithValueHead`].
        ref_model: frozen reference for the KL penalty. ``None``: a copy of ``model`` (sharing the lower
            ``num_shared_layers`` layers), or, for a PEFT model, the same model with its adapters disabled.
            The copy is an [`OffloadedReference`] (weights in a memory-mapped snapshot file, see
            ``PPOConfig.offload_reference``) on CPU for models of 256 MiB or more.
        tokenizer: the tokenizer (padding side and pad token of the PPO batches; `generate`; saved with the model).
        dataset: optional torch or 🤗 dataset; ``self.dataloader`` then yields batches of ``batch_size``.
        optimizer: default ``Adam(trainable parameters, lr=config.learning_rate)`` (fused where torch has it).
        data_collator: collate function of the dataloader.
        num_shared_layers: freeze the embeddings and this many lower layers and share them with the reference.
        lr_scheduler: a ``torch.optim.lr_scheduler.LRScheduler``, stepped once per ``step``.
        training_data_collator: pads query+response rows (must return ``input_ids`` and ``attention_mask``);
            default: padding with the tokenizer's pad token on the tokenizer's padding side.
    """

    def __init__(
        self,
        config: PPOConfig | None = None,
        model: nn.Module | None = None,
        ref_model: nn.Module | None = None,
        tokenizer=None,
        dataset=None,
        optimizer: torch.optim.Optimizer | None = None,
        data_collator: Callable | None = None,
        num_shared_layers: int | None = None,
        lr_scheduler=None,
        training_data_collator: Callable | None = None,
    ):
        from accelerate.utils import set_seed

        config = config if config is not None else PPOConfig()
        check_constructor_args(config, model, tokenizer, dataset, lr_scheduler)
        self.config = config
        set_seed(config.seed)
        self.accelerator = make_accelerator(config, config.gradient_accumulation_steps)
        configure_deepspeed(self.accelerator, config)
        config.world_size = self.accelerator.num_processes
        config.global_backward_batch_size = config.backward_batch_size * config.world_size
        config.global_batch_size = config.batch_size * config.world_size
        self.is_distributed = self.accelerator.num_processes > 1
        self.is_peft_model = model.is_peft_model
        config.is_peft_model = self.is_peft_model
        self.is_encoder_decoder = hasattr(model, "is_encoder_decoder")  # legacy: only the seq2seq wrapper has it
        config.is_encoder_decoder = self.is_encoder_decoder
        self.tokenizer = tokenizer
        self.pad_token_id = pad_token_id(tokenizer, model)

        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.ref_model = build_reference(self, model, ref_model, num_shared_layers)
        self.num_shared_layers = num_shared_layers

        self.dataset = dataset
        self.data_collator = data_collator
        self.dataloader = None
        if dataset is not None:
            self.dataloader = self.prepare_dataloader(dataset, data_collator)
        else:
            warnings.warn(
                "No dataset is provided. Make sure to set config.batch_size to the correct value before training.",
                UserWarning,
                stacklevel=2,
            )
        self.training_data_collator = training_data_collator

        owns_optimizer = optimizer is None
        if optimizer is None:
            optimizer = default_optimizer([p for p in model.parameters() if p.requires_grad], config.learning_rate)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.lr_scheduler = self.accelerator.prepare(lr_scheduler) if lr_scheduler is not None else None
        if self.dataloader is not None:
            self.dataloader = self.accelerator.prepare(self.dataloader)
        # A list, not a one-shot iterator: clipping must see the parameters on every call.
        self.trainable_params = [p for p in self.model.parameters() if p.requires_grad]
        self.step_in_backward = make_step_in_backward(self, owns_optimizer)
        if self.ref_model is not None:
            self.ref_model = prepare_reference(self.accelerator, self.ref_model)
        self.current_device = self.accelerator.device

        if config.adap_kl_ctrl:
            self.kl_ctl = AdaptiveKLController(config.init_kl_coef, config.target, config.horizon)
        else:
            self.kl_ctl = FixedKLController(config.init_kl_coef)
        self.running = RunningMoments(self.accelerator)
        self.current_step = 0
        self.highest_reward = torch.tensor(-float("inf"))
        if config.push_to_hub_if_best_kwargs and "repo_id" not in config.push_to_hub_if_best_kwargs:
            raise ValueError("You have to specify repo_id in order to push the model to the hub!")
        if config.log_with is not None:
            init_trackers(self.accelerator, config)

    def prepare_dataloader(self, dataset, data_collator=None) -> torch.utils.data.DataLoader:
        """A shuffling, last-batch-dropping DataLoader of ``config.batch_size``; 🤗 datasets lose the columns
        the model does not take (unless ``remove_unused_columns=False``)."""
        return make_dataloader(self.config, dataset, data_collator)

    # ---------------------------------------------------------------------------------------------
    # step
    # ---------------------------------------------------------------------------------------------
    def step(
        self,
        queries: Sequence[torch.LongTensor],
        responses: Sequence[torch.LongTensor],
        scores: Sequence[torch.Tensor],
        response_masks: Sequence[torch.Tensor] | None = None,
        rollout_logprobs: Sequence[torch.Tensor] | None = None,
    ) -> dict:
        """One PPO optimisation step on a batch of episodes.

        Args:
            queries: ``batch_size`` 1-D LongTensors (prompt tokens).
            responses: ``batch_size`` 1-D LongTensors (everything after the prompt, tool output included).
            scores: ``batch_size`` scalar tensors (or numbers), one reward per episode.
            response_masks: optional 1-D 0/1 tensors of each response's length: 1 = trained on (model tokens),
                0 = ignored (tool output). Masked positions have no effect on the loss.
            rollout_logprobs: optional 1-D float tensors of each response's length: the inference engine's
                log-probability of every response token (anything, e.g. NaN, on mask-0 tokens), e.g.
                ``history.response_logprobs()``. Required with ``config.vllm_importance_sampling_correction``
                (the off-policy correction, see `textenv.off_policy`); ignored without it.

        Returns:
            The statistics of legacy TRL (``objective/*``, ``ppo/*``, ``tokens/*``, ``time/*``): numpy arrays,
            and Python floats for single values unless ``log_with="wandb"``; with the correction also
            ``objective/importance_sampling_ratio_mean``, ``..._ratio_max``, ``..._clipped_frac`` and ``..._masked_frac``.
        """
        with self._device_cache_guard():
            return self._step(queries, responses, scores, response_masks, rollout_logprobs)

    def _step(self, queries, responses, scores, response_masks, rollout_logprobs=None) -> dict:
        config = self.config
        t_start = time.time()
        timing = {}
        queries, responses, scores, response_masks = self._step_safety_checker(
            config.batch_size, queries, responses, scores, response_masks
        )
        rollout_logprobs = self._checked_rollout_logprobs(rollout_logprobs, responses, response_masks)
        scores = self._scale_scores(torch.stack(scores))  # [B]
        self._push_if_best(scores)

        t = time.time()
        model_inputs = self._pad_across_processes(self.prepare_model_inputs(queries, responses))
        legacy_forward = self._runs_legacy_forward()
        with torch.no_grad():
            logprobs, ref_logprobs, values, masks, packed, kl_inputs, policy_pass = self._experience_forward(
                queries, responses, response_masks, model_inputs, legacy_forward
            )
        weights, importance_stats = self._importance_weights(rollout_logprobs, queries, model_inputs, logprobs, masks)
        timing["time/ppo/forward_pass"] = time.time() - t

        with torch.no_grad():
            t = time.time()
            rewards, non_score_reward, kls = self.compute_rewards(scores, *kl_inputs, masks)
            del kl_inputs
            timing["time/ppo/compute_rewards"] = time.time() - t
            t = time.time()
            values, advantages, returns = self.compute_advantages(values, rewards, masks)
            timing["time/ppo/compute_advantages"] = time.time() - t

        t = time.time()
        experience = {"queries": queries, "responses": responses, "model_inputs": model_inputs, "packed": packed,
                   "logprobs": core.upcast_half(logprobs), "values": core.upcast_half(values), "masks": masks,
                   "advantages": advantages, "returns": returns, "policy_pass": policy_pass, "weights": weights}
        all_stats = self._optimise(experience, legacy_forward)
        timing["time/ppo/optimize_step"] = time.time() - t

        t = time.time()
        stats = self.record_step_stats(
            scores=scores, logprobs=logprobs, ref_logprobs=ref_logprobs, non_score_reward=non_score_reward,
            train_stats=stack_train_stats(all_stats), kl_coef=self.kl_ctl.value, masks=masks,
            queries=queries, responses=responses, kls=kls,
        )
        stats.update(importance_stats)
        if self.is_distributed:
            stats = self.gather_stats(stats)
        stats = stats_to_np(stats)
        timing["time/ppo/calc_stats"] = time.time() - t
        stats["ppo/learning_rate"] = self.optimizer.param_groups[0]["lr"]

        self.kl_ctl.update(stats["objective/kl"], config.batch_size * self.accelerator.num_processes)
        timing["time/ppo/total"] = time.time() - t_start
        stats.update(timing)
        if config.log_with != "wandb":
            stats = convert_to_scalar(stats)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.current_step += 1
        return stats

    def _experience_forward(self, queries, responses, response_masks, model_inputs, legacy_forward: bool):
        """The no-grad passes of the policy and the reference over the whole batch.

        Returns:
            `(logprobs, ref_logprobs, values, masks, packed, kl_inputs, policy_pass)`: `[B, T]` tensors, the windowed
            path's [`PackedBatch`] (``None`` on the legacy path), the two arguments `compute_rewards` compares (full
            `[B, T, V]` log-probabilities for ``kl_penalty="full"``) and the first training mini-batch's forward
            pass when it ran here (see `_first_minibatch_rows`).
        """
        full_kl = self.config.kl_penalty == "full"
        if not legacy_forward:
            packed = pack_batch(queries, responses, response_masks, model_inputs["input_ids"], model_inputs["attention_mask"])
            logprobs, ref_logprobs, values, policy_pass = self._windowed_experience_forward(packed, self._first_minibatch_rows())
            return logprobs, ref_logprobs, values, packed.masks, packed, (logprobs, ref_logprobs), policy_pass
        logprobs, logits, values, masks = self.batched_forward_pass(
            self.model, queries, responses, model_inputs, response_masks=response_masks, return_logits=full_kl
        )
        with self._reference_context() as reference, self.accelerator.autocast():  # an unprepared copy: not autocast itself
            ref_logprobs, ref_logits, _, _ = self.batched_forward_pass(
                reference, queries, responses, model_inputs, return_logits=full_kl
            )
        kl_inputs = (logprobs, ref_logprobs)
        if full_kl:
            kl_inputs = (core.logprobs_from_logits(logits, None, gather=False), core.logprobs_from_logits(ref_logits, None, gather=False))
        return logprobs, ref_logprobs, values, masks, None, kl_inputs, None

    def _runs_legacy_forward(self) -> bool:
        """Whether `step` must run `batched_forward_pass` / `train_minibatch` / `loss` themselves (overridden, or
        full-width logits needed) rather than their windowed equivalent."""
        return (
            self.is_encoder_decoder
            or self.config.kl_penalty == "full"
            or any(self._is_overridden(name) for name in FORWARD_HOOKS)
        )

    def _is_overridden(self, name: str) -> bool:
        # A subclass method, an attribute set on the instance, or a patch of the class attribute.
        return name in vars(self) or getattr(type(self), name) is not _BUILTIN_METHODS[name]

    def _push_if_best(self, scores: torch.Tensor) -> None:
        kwargs = self.config.push_to_hub_if_best_kwargs
        if not kwargs or self.current_step % self.config.compare_steps != 0:
            return
        mean_score = self.accelerator.gather(scores).float().mean().cpu()
        if mean_score > self.highest_reward:
            self.highest_reward = mean_score
            if self.accelerator.is_main_process:
                self.accelerator.unwrap_model(self.model).push_to_hub(**kwargs)

    # ---------------------------------------------------------------------------------------------
    # optimisation
    # ---------------------------------------------------------------------------------------------
    def _optimise(self, experience: dict, legacy_forward: bool) -> list[dict]:
        """``ppo_epochs`` passes over random mini-batches (grouped into backward batches for accumulation)."""
        config = self.config
        all_stats = []
        for _ in range(config.ppo_epochs):
            order = np.random.permutation(config.batch_size)
            for backward_begin in range(0, config.batch_size, config.backward_batch_size):
                backward_rows = order[backward_begin : backward_begin + config.backward_batch_size]
                for mini_begin in range(0, config.backward_batch_size, config.mini_batch_size):
                    rows = backward_rows[mini_begin : mini_begin + config.mini_batch_size]
                    with self.accelerator.accumulate(self.model):
                        all_stats.append(self._train_rows(experience, rows, legacy_forward))
            if config.early_stopping and self._early_stop(all_stats[-1]["policy/policykl"]):
                break
        return all_stats

    def _train_rows(self, experience: dict, rows: np.ndarray, legacy_forward: bool) -> dict:
        index = torch.as_tensor(rows, device=experience["masks"].device)
        old = {key: experience[key][index] for key in ("logprobs", "values", "masks", "advantages", "returns")}
        policy_pass = self._take_policy_pass(experience, rows)
        weights = {"importance_weights": experience["weights"][index]} if experience["weights"] is not None else {}
        if not legacy_forward:
            return self._windowed_train_minibatch(
                experience["packed"].select(index), old["logprobs"], old["values"], old["advantages"], old["returns"], policy_pass, **weights
            )
        queries = [experience["queries"][row] for row in rows]
        responses = [experience["responses"][row] for row in rows]
        model_inputs = {key: value[index] for key, value in experience["model_inputs"].items()}
        logprobs, logits, vpreds, _ = self.batched_forward_pass(self.model, queries, responses, model_inputs, return_logits=True)
        return self.train_minibatch(
            old["logprobs"], old["values"], logprobs, logits, vpreds, old["masks"], old["advantages"], old["returns"], **weights
        )

    def _apply_gradients(self, loss: torch.Tensor) -> None:
        """Backward, then clip, step and zero the gradients (or step each parameter during backward)."""
        if self.step_in_backward is not None:
            with self.step_in_backward.active():
                self.accelerator.backward(loss)  # updates each parameter as its gradient completes
            return
        self.accelerator.backward(loss)
        if self.config.max_grad_norm is not None and self.accelerator.sync_gradients:
            self.accelerator.clip_grad_norm_(self.trainable_params, self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad()

    @contextlib.contextmanager
    def _reference_context(self):
        """The reference model: the PEFT policy with its adapters disabled, a mapped `OffloadedReference`, or
        ``ref_model``."""
        if self.ref_model is None:
            with self.accelerator.unwrap_model(self.model).pretrained_model.disable_adapter():
                yield self.model
        elif isinstance(self.ref_model, OffloadedReference):
            with self.ref_model.loaded() as reference:
                yield reference
        else:
            yield self.ref_model

    @contextlib.contextmanager
    def _device_cache_guard(self):
        try:
            yield
        finally:
            if self.config.optimize_device_cache:
                empty_device_cache()


_BUILTIN_METHODS = {name: getattr(PPOStepMethods, name) for name in FORWARD_HOOKS}
