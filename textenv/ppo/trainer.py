"""PPOTrainer: the legacy step-based PPO loop (``step(queries, responses, scores, masks)``) on accelerate.

The math is legacy TRL's (v0.11.4); the computation is leaner: one forward pass gives policy logprobs and
values, the LM head only runs on the response positions of each mini-batch, logprobs are gathered without a
full log-softmax, and full logits exist only briefly (per mini-batch) for ``kl_penalty="full"``. Rows that
share a prompt run it once (`shared_prefix`), the default Adam is fused and steps each parameter during
backward (`step_in_backward`), and on CPU the reference copy lives in a memory-mapped file
(`offloaded_reference`).
"""

from __future__ import annotations

import contextlib
import gc
import time
import warnings
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from textenv.ppo import core, shared_prefix
from textenv.ppo.batch import PackedBatch, pack_batch, right_pad
from textenv.ppo.config import PPOConfig
from textenv.ppo.inputs import check_step_inputs
from textenv.ppo.offloaded_reference import OffloadedReference, should_offload
from textenv.ppo.shared_prefix import PrefixPacking
from textenv.ppo.step_in_backward import StepInBackward
from textenv.ppo.value_head import AutoModelForCausalLMWithValueHead, create_reference_model

WANDB_PADDING = -1
FUSED_ADAM_DEVICES = ("cpu", "cuda")


def empty_device_cache() -> None:
    """``gc.collect()`` and release cached accelerator memory."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        torch.xpu.empty_cache()
    elif torch.backends.mps.is_available():
        torch.mps.empty_cache()


def default_optimizer(params: list[nn.Parameter], learning_rate: float) -> torch.optim.Adam:
    """Adam, as legacy TRL, with the fused kernel where it exists: one pass over each parameter and its two
    moments instead of about ten (6x faster on CPU for the bundled model; same update to float rounding)."""
    fused = all(param.device.type in FUSED_ADAM_DEVICES and param.is_floating_point() for param in params)
    return torch.optim.Adam(params, lr=learning_rate, fused=fused or None)


def stack_train_stats(all_stats: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack per-mini-batch statistics: scalars -> `[n]`; tensors are flattened and padded with -1."""
    stacked = {}
    for key in all_stats[0]:
        rows = [stats[key].flatten() for stats in all_stats]
        stacked[key] = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=WANDB_PADDING)
    for key in ("policy/advantages", "policy/ratio"):
        stacked[key] = torch.nan_to_num(stacked[key].flatten().unsqueeze(0), WANDB_PADDING)
    return stacked


def _to_python(value):
    if isinstance(value, torch.Tensor):
        value = value.detach().float().cpu().numpy() if value.dtype == torch.bfloat16 else value.detach().cpu().numpy()
    if isinstance(value, np.ndarray) and value.size == 1:
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    return value


class PPOTrainer:
    """Proximal Policy Optimisation on given (query, response, score) triples, one ``step`` at a time.

    Args:
        config: a [`PPOConfig`].
        model: the policy, an [`AutoModelForCausalLMWithValueHead`].
        ref_model: frozen reference for the KL penalty. ``None``: a copy of ``model`` (sharing the lower
            ``num_shared_layers`` layers), or, for a PEFT model, the same model with its adapters disabled.
            The copy is an [`OffloadedReference`] (weights in a memory-mapped snapshot file, see
            ``PPOConfig.offload_reference``) on CPU for models of 256 MiB or more.
        tokenizer: the tokenizer (needed for `generate` and to save it alongside the model).
        dataset: optional torch or 🤗 dataset; ``self.dataloader`` then yields batches of ``batch_size``.
        optimizer: default ``Adam(trainable parameters, lr=config.learning_rate)`` (fused where torch has it).
        data_collator: collate function of the dataloader.
        num_shared_layers: freeze the embeddings and this many lower layers and share them with the reference.
        lr_scheduler: a ``torch.optim.lr_scheduler.LRScheduler``, stepped once per ``step``.
        training_data_collator: pads query+response rows (must return ``input_ids`` and ``attention_mask``);
            default: right padding with the tokenizer's pad token.
    """

    def __init__(
        self,
        config: PPOConfig | None = None,
        model: AutoModelForCausalLMWithValueHead | None = None,
        ref_model: nn.Module | None = None,
        tokenizer=None,
        dataset=None,
        optimizer: torch.optim.Optimizer | None = None,
        data_collator: Callable | None = None,
        num_shared_layers: int | None = None,
        lr_scheduler=None,
        training_data_collator: Callable | None = None,
    ):
        from accelerate import Accelerator
        from accelerate.utils import GradientAccumulationPlugin, ProjectConfiguration, set_seed

        config = config if config is not None else PPOConfig()
        self._check_constructor_args(config, model, tokenizer, dataset, lr_scheduler)
        self.config = config
        set_seed(config.seed)

        accelerator_kwargs = dict(config.accelerator_kwargs)
        if _launched_on_cpu_only():
            # accelerate treats a torchrun/mpirun launch on a machine without accelerators as a single process
            # unless told to use the CPU; say it, so the processes really train together (gloo).
            accelerator_kwargs.setdefault("cpu", True)
        accelerator_kwargs.setdefault(
            "gradient_accumulation_plugin",
            GradientAccumulationPlugin(num_steps=config.gradient_accumulation_steps, sync_with_dataloader=False),
        )
        self.accelerator = Accelerator(
            log_with=config.log_with, project_config=ProjectConfiguration(**config.project_kwargs), **accelerator_kwargs
        )
        self._configure_deepspeed()
        config.world_size = self.accelerator.num_processes
        config.global_backward_batch_size = config.backward_batch_size * config.world_size
        config.global_batch_size = config.batch_size * config.world_size
        self.is_distributed = self.accelerator.num_processes > 1
        self.is_peft_model = model.is_peft_model
        config.is_peft_model = self.is_peft_model
        config.is_encoder_decoder = False
        self.is_encoder_decoder = False
        self.tokenizer = tokenizer
        self.pad_token_id = self._pad_token_id(tokenizer, model)

        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.ref_model = self._build_reference(model, ref_model, num_shared_layers)
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
        self.step_in_backward = self._make_step_in_backward(owns_optimizer)
        if self.ref_model is not None:
            self.ref_model = self._prepare_reference(self.ref_model)
        self.current_device = self.accelerator.device

        if config.adap_kl_ctrl:
            self.kl_ctl = core.AdaptiveKLController(config.init_kl_coef, config.target, config.horizon)
        else:
            self.kl_ctl = core.FixedKLController(config.init_kl_coef)
        self.running = core.RunningMoments(self.accelerator)
        self.current_step = 0
        self.highest_reward = torch.tensor(-float("inf"))
        if config.push_to_hub_if_best_kwargs and "repo_id" not in config.push_to_hub_if_best_kwargs:
            raise ValueError("You have to specify repo_id in order to push the model to the hub!")
        if config.log_with is not None:
            self._init_trackers()

    # ---------------------------------------------------------------------------------------------
    # construction helpers
    # ---------------------------------------------------------------------------------------------
    @staticmethod
    def _check_constructor_args(config, model, tokenizer, dataset, lr_scheduler) -> None:
        from transformers import PreTrainedTokenizerBase

        if not isinstance(config, PPOConfig):
            raise ValueError(f"config must be a PPOConfig, got {type(config).__name__}")
        if not isinstance(model, AutoModelForCausalLMWithValueHead):
            raise ValueError(
                f"model must be an AutoModelForCausalLMWithValueHead, got {type(model).__name__}; wrap a causal LM "
                "with AutoModelForCausalLMWithValueHead(model) or load it with .from_pretrained(...)"
            )
        if tokenizer is not None and not isinstance(tokenizer, PreTrainedTokenizerBase):
            raise ValueError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
        if dataset is not None and not isinstance(dataset, torch.utils.data.Dataset):
            try:
                import datasets

                ok = isinstance(dataset, datasets.Dataset)
            except ImportError:
                ok = False
            if not ok:
                raise ValueError(f"dataset must be a torch.utils.data.Dataset or datasets.Dataset, got {type(dataset).__name__}")
        if lr_scheduler is not None and not isinstance(lr_scheduler, torch.optim.lr_scheduler.LRScheduler):
            raise ValueError("lr_scheduler must be a torch.optim.lr_scheduler.LRScheduler")

    @staticmethod
    def _pad_token_id(tokenizer, model) -> int:
        for candidate in (
            getattr(tokenizer, "pad_token_id", None),
            getattr(tokenizer, "eos_token_id", None),
            getattr(model.config, "pad_token_id", None),
        ):
            if isinstance(candidate, int):
                return candidate
        return 0

    def _configure_deepspeed(self) -> None:
        # DeepSpeed needs the micro batch size up front; PPO has no dataloader to infer it from.
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        if plugin is None:
            return
        ds_config = plugin.deepspeed_config
        if ds_config.get("train_micro_batch_size_per_gpu", "auto") == "auto":
            ds_config["train_micro_batch_size_per_gpu"] = self.config.mini_batch_size
        if ds_config.get("gradient_accumulation_steps", "auto") == "auto":
            ds_config["gradient_accumulation_steps"] = self.config.gradient_accumulation_steps

    def _build_reference(self, model, ref_model, num_shared_layers):
        if self.config.offload_reference and (ref_model is not None or num_shared_layers is not None or self.is_peft_model):
            raise ValueError(
                "offload_reference=True only applies when the trainer copies the model for the reference; it "
                "cannot be combined with ref_model, num_shared_layers or a PEFT model (leave it None)"
            )
        if ref_model is not None:
            if num_shared_layers is not None:
                warnings.warn(
                    "num_shared_layers is ignored when ref_model is given; pass only one of them.",
                    UserWarning,
                    stacklevel=3,
                )
            if not isinstance(ref_model, AutoModelForCausalLMWithValueHead):
                ref_model = AutoModelForCausalLMWithValueHead(ref_model)
            for param in ref_model.parameters():
                param.requires_grad_(False)
            return ref_model.eval()
        if self.is_peft_model:
            return None  # the reference is the same model with its adapters disabled
        if num_shared_layers is None and should_offload(self.config.offload_reference, model, self.accelerator.device):
            return OffloadedReference(model, self.accelerator.device)
        return create_reference_model(model, num_shared_layers=num_shared_layers)

    def _make_step_in_backward(self, owns_optimizer: bool) -> StepInBackward | None:
        """Fuse the optimizer step into backward (see `textenv.ppo.step_in_backward`) when nothing needs all
        gradients at once: our own optimizer, one process, no accumulation, clipping, loss scaling or DeepSpeed."""
        config = self.config
        fusable = (
            config.step_in_backward
            and owns_optimizer
            and self.accelerator.num_processes == 1
            and config.gradient_accumulation_steps == 1
            and config.max_grad_norm is None
            and self.accelerator.scaler is None
            and getattr(self.accelerator.state, "deepspeed_plugin", None) is None
        )
        return StepInBackward(self.optimizer.optimizer, self.trainable_params) if fusable else None

    def _prepare_reference(self, ref_model):
        if isinstance(ref_model, OffloadedReference):
            return ref_model  # loaded onto its device at each use
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        if plugin is not None and plugin.zero_stage == 3:
            import deepspeed

            ds_config = dict(plugin.deepspeed_config)
            ds_config.pop("optimizer", None)
            ds_config.pop("scheduler", None)
            engine, *_ = deepspeed.initialize(model=ref_model, config=ds_config)
            engine.eval()
            return engine
        return ref_model.to(self.accelerator.device)

    def _init_trackers(self) -> None:
        if self.config.log_with == "tensorboard":
            hparams = {
                k: v for k, v in self.config.to_dict().items() if isinstance(v, (int, float, str, bool)) and v is not None
            }
            tracker_config = hparams
        else:
            tracker_config = {"trl_ppo_trainer_config": self.config.to_dict()}
        self.accelerator.init_trackers(
            self.config.tracker_project_name, config=tracker_config, init_kwargs=self.config.tracker_kwargs
        )

    def prepare_dataloader(self, dataset, data_collator=None) -> torch.utils.data.DataLoader:
        """A shuffling, last-batch-dropping DataLoader of ``config.batch_size``; 🤗 datasets lose the columns
        the model does not take (unless ``remove_unused_columns=False``)."""
        try:
            import datasets

            if isinstance(dataset, datasets.Dataset) and self.config.remove_unused_columns:
                keep = {"input_ids", "attention_mask", "label", "query", "response"}
                unused = [c for c in dataset.column_names if c not in keep]
                dataset = dataset.remove_columns(unused) if unused else dataset
        except ImportError:
            pass
        return torch.utils.data.DataLoader(
            dataset, batch_size=self.config.batch_size, collate_fn=data_collator, shuffle=True, drop_last=True
        )

    # ---------------------------------------------------------------------------------------------
    # step
    # ---------------------------------------------------------------------------------------------
    def step(
        self,
        queries: Sequence[torch.LongTensor],
        responses: Sequence[torch.LongTensor],
        scores: Sequence[torch.Tensor],
        response_masks: Sequence[torch.Tensor] | None = None,
    ) -> dict:
        """One PPO optimisation step on a batch of episodes.

        Args:
            queries: ``batch_size`` 1-D LongTensors (prompt tokens).
            responses: ``batch_size`` 1-D LongTensors (everything after the prompt, tool output included).
            scores: ``batch_size`` scalar tensors (or numbers), one reward per episode.
            response_masks: optional 1-D 0/1 tensors of each response's length: 1 = trained on (model tokens),
                0 = ignored (tool output). Masked positions have no effect on the loss.

        Returns:
            The statistics of spec §3.7 (``objective/*``, ``ppo/*``, ``tokens/*``, ``time/*``), as Python
            floats or numpy arrays.
        """
        with self._device_cache_guard():
            return self._step(queries, responses, scores, response_masks)

    def _step(self, queries, responses, scores, response_masks) -> dict:
        config = self.config
        batch_size = config.batch_size
        t_start = time.time()
        timing = {}
        queries, responses, scores, response_masks = check_step_inputs(
            queries, responses, scores, response_masks, batch_size, self._vocab_size()
        )
        device = self.current_device
        queries = [q.to(device) for q in queries]
        responses = [r.to(device) for r in responses]
        scores = scores.to(device)
        scores = self._scale_scores(scores)
        self._push_if_best(scores)

        t = time.time()
        batch = self.prepare_model_inputs(queries, responses, response_masks)
        with torch.no_grad():
            logprobs, ref_logprobs, values, kls = self._rollout_forward(batch)
        timing["time/ppo/forward_pass"] = time.time() - t

        with torch.no_grad():
            t = time.time()
            rewards, non_score_reward = core.compute_rewards(scores, kls, batch.masks, self.kl_ctl.value)
            timing["time/ppo/compute_rewards"] = time.time() - t
            t = time.time()
            values, advantages, returns = core.compute_advantages(
                values, rewards, batch.masks, config.gamma, config.lam, config.whiten_rewards
            )
            timing["time/ppo/compute_advantages"] = time.time() - t

        t = time.time()
        all_stats = self._optimise(batch, logprobs, values, advantages, returns)
        timing["time/ppo/optimize_step"] = time.time() - t

        t = time.time()
        stats = self.record_step_stats(
            scores=scores,
            logprobs=logprobs,
            ref_logprobs=ref_logprobs,
            non_score_reward=non_score_reward,
            kls=kls,
            masks=batch.masks,
            queries=queries,
            responses=responses,
            train_stats=stack_train_stats(all_stats),
        )
        if self.is_distributed:
            stats = self.gather_stats(stats)
        stats = {key: _to_python(value) for key, value in stats.items()}
        timing["time/ppo/calc_stats"] = time.time() - t
        stats["ppo/learning_rate"] = self.optimizer.param_groups[0]["lr"]

        self.kl_ctl.update(stats["objective/kl"], config.batch_size * self.accelerator.num_processes)
        timing["time/ppo/total"] = time.time() - t_start
        stats.update(timing)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.current_step += 1
        return stats

    def _vocab_size(self) -> int | None:
        embeddings = self.accelerator.unwrap_model(self.model).causal_lm.get_input_embeddings()
        return getattr(embeddings, "num_embeddings", None)

    def _scale_scores(self, scores: torch.Tensor) -> torch.Tensor:
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

    def _push_if_best(self, scores: torch.Tensor) -> None:
        kwargs = self.config.push_to_hub_if_best_kwargs
        if not kwargs or self.current_step % self.config.compare_steps != 0:
            return
        mean_score = self.accelerator.gather(scores).float().mean().cpu()
        if mean_score > self.highest_reward:
            self.highest_reward = mean_score
            if self.accelerator.is_main_process:
                self.accelerator.unwrap_model(self.model).push_to_hub(**kwargs)

    def prepare_model_inputs(
        self,
        queries: list[torch.Tensor],
        responses: list[torch.Tensor],
        response_masks: list[torch.Tensor] | None = None,
    ) -> PackedBatch:
        """Concatenate each query and response, pad (right, or with ``training_data_collator``), pad across
        processes, and compute the trainable-position masks."""
        rows = [torch.cat([q, r]) for q, r in zip(queries, responses)]
        pad_first = False
        if self.training_data_collator is None:
            input_ids = right_pad(rows, self.pad_token_id)
            attention_mask = right_pad([torch.ones_like(row) for row in rows], 0)
        else:
            padded = self.training_data_collator([{"input_ids": row, "attention_mask": torch.ones_like(row)} for row in rows])
            input_ids = padded["input_ids"].to(self.current_device)
            attention_mask = padded["attention_mask"].to(self.current_device)
            pad_first = getattr(self.tokenizer, "padding_side", "right") == "left"
        if self.is_distributed:
            input_ids = self.accelerator.pad_across_processes(input_ids, dim=1, pad_index=self.pad_token_id, pad_first=pad_first)
            attention_mask = self.accelerator.pad_across_processes(attention_mask, dim=1, pad_index=0, pad_first=pad_first)
        return pack_batch(queries, responses, response_masks, input_ids, attention_mask)

    # ---------------------------------------------------------------------------------------------
    # forward passes
    # ---------------------------------------------------------------------------------------------
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

    @contextlib.contextmanager
    def _reference_context(self):
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

    def _rollout_forward(self, batch: PackedBatch):
        """No-grad passes of the policy and the reference, one mini-batch at a time.

        Returns:
            `(logprobs, ref_logprobs, values, kls)`, each `[B, L - 1]`.
        """
        chunk = self.config.mini_batch_size
        num_positions = batch.num_positions
        outputs = {"logprobs": [], "ref_logprobs": [], "values": [], "kls": []}
        self.model.eval()
        with self._device_cache_guard():
            for begin in range(0, batch.input_ids.shape[0], chunk):
                part = batch.select(slice(begin, begin + chunk))
                logits, values, window = self._forward_window(self.model, part)
                labels = self._labels(part, window)
                logprobs = core.selective_logprobs(logits, labels)
                with self._reference_context() as reference:
                    ref_logits, _, ref_window = self._forward_window(reference, part)
                ref_logprobs = core.selective_logprobs(ref_logits, labels)
                if self.config.kl_penalty == "full":
                    kls = core.full_kl_penalty(logits, ref_logits)
                else:
                    kls = core.kl_penalty(logprobs, ref_logprobs, self.config.kl_penalty)
                del logits, ref_logits
                outputs["logprobs"].append(self._place(logprobs, window, num_positions))
                outputs["ref_logprobs"].append(self._place(ref_logprobs, window, num_positions))
                outputs["values"].append(values)
                outputs["kls"].append(self._place(kls, window, num_positions))
        return tuple(torch.cat(outputs[key]) for key in ("logprobs", "ref_logprobs", "values", "kls"))

    # ---------------------------------------------------------------------------------------------
    # optimisation
    # ---------------------------------------------------------------------------------------------
    def _optimise(self, batch, old_logprobs, old_values, advantages, returns) -> list[dict]:
        config = self.config
        all_stats = []
        early_stop = False
        for _ in range(config.ppo_epochs):
            if early_stop:
                break
            order = np.random.permutation(config.batch_size)
            for backward_begin in range(0, config.batch_size, config.backward_batch_size):
                backward_rows = order[backward_begin : backward_begin + config.backward_batch_size]
                for mini_begin in range(0, config.backward_batch_size, config.mini_batch_size):
                    rows = torch.as_tensor(backward_rows[mini_begin : mini_begin + config.mini_batch_size], device=batch.input_ids.device)
                    with self.accelerator.accumulate(self.model):
                        train_stats = self.train_minibatch(
                            batch.select(rows), old_logprobs[rows], old_values[rows], advantages[rows], returns[rows]
                        )
                    all_stats.append(train_stats)
            if config.early_stopping:
                early_stop = self._early_stop(train_stats["policy/policykl"])
        return all_stats

    def train_minibatch(self, part: PackedBatch, old_logprobs, old_values, advantages, returns) -> dict:
        """Forward with gradients, PPO loss, backward, (clip,) optimizer step on one mini-batch."""
        with self._device_cache_guard():
            self._set_training_forward_mode()
            num_positions = part.num_positions
            logits, vpreds, window = self._forward_window(self.model, part)
            logprobs = self._place(core.selective_logprobs(logits, self._labels(part, window)), window, num_positions)
            with torch.no_grad():
                entropy = self._place(_rowwise_entropy(logits), window, num_positions)
            del logits
            loss, stats, skipped = core.ppo_loss(
                old_logprobs, old_values, logprobs, vpreds, entropy, part.masks, advantages, returns,
                self.config.cliprange, self.config.cliprange_value, self.config.vf_coef, self.config.ratio_threshold,
            )
            if skipped:
                warnings.warn(
                    f"The average ratio of batch ({stats['policy/ratio'][part.masks.bool()].mean():.2f}) exceeds "
                    f"threshold {self.config.ratio_threshold:.2f}. Skipping batch.",
                    UserWarning,
                    stacklevel=2,
                )
            self.model.train()
            if self.step_in_backward is not None:
                with self.step_in_backward.active():
                    self.accelerator.backward(loss)  # updates each parameter as its gradient completes
                return stats
            self.accelerator.backward(loss)
            if self.config.max_grad_norm is not None and self.accelerator.sync_gradients:
                self.accelerator.clip_grad_norm_(self.trainable_params, self.config.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad()
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

    def _early_stop(self, policykl: torch.Tensor) -> bool:
        policykl = policykl.detach().clone().float().to(self.current_device)
        if self.is_distributed:
            policykl = self.accelerator.reduce(policykl, reduction="mean")
        if policykl > 1.5 * self.config.target_kl:
            self.optimizer.zero_grad()
            return True
        return False

    # ---------------------------------------------------------------------------------------------
    # statistics and logging
    # ---------------------------------------------------------------------------------------------
    def record_step_stats(self, kl_coef: float | None = None, **data) -> dict:
        """The legacy step statistics from the batch tensors and the stacked train statistics."""
        kl_coef = self.kl_ctl.value if kl_coef is None else kl_coef
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
        stats["tokens/queries_dist"] = query_lens.numpy()  # legacy key; spec §3.7 also names it ..._len_dist
        stats["tokens/queries_len_dist"] = stats["tokens/queries_dist"]
        stats["tokens/responses_len_mean"] = response_lens.mean().item()
        stats["tokens/responses_len_std"] = response_lens.std().item()
        stats["tokens/responses_dist"] = response_lens.numpy()
        stats["tokens/responses_len_dist"] = stats["tokens/responses_dist"]
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
        logs = {key: _to_python(value) for key, value in stats.items()}
        logs["env/reward_mean"] = rewards.mean().item()
        logs["env/reward_std"] = rewards.std().item() if rewards.numel() > 1 else 0.0
        logs["env/reward_dist"] = rewards.cpu().numpy()
        if self.config.log_with == "tensorboard":
            logs = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
        self.accelerator.log(logs, step=self.current_step)

    # ---------------------------------------------------------------------------------------------
    # generation
    # ---------------------------------------------------------------------------------------------
    def generate(
        self,
        query_tensor: torch.Tensor | list[torch.Tensor],
        length_sampler: Callable[[], int] | None = None,
        batch_size: int = 4,
        return_prompt: bool = True,
        generate_ref_response: bool = False,
        **generation_kwargs,
    ):
        """Sample responses with the policy (and optionally the reference).

        Args:
            query_tensor: a 1-D tensor (returns `[1, L]`) or a list of 1-D tensors (batched with left padding;
                returns a list of 1-D tensors cut after the first generated EOS).
            length_sampler: called per batch to set ``max_new_tokens``.
            batch_size: generation batch size for a list.
            return_prompt: keep the prompt tokens in the output.
            generate_ref_response: also generate with the reference model; returns ``(response, ref_response)``.
        """
        if isinstance(query_tensor, torch.Tensor) and query_tensor.dim() != 1:
            raise ValueError(f"query_tensor must be a 1-D tensor or a list of them, got shape {tuple(query_tensor.shape)}")
        policy = self.accelerator.unwrap_model(self.model)
        response = self._generate_with(policy, query_tensor, length_sampler, batch_size, return_prompt, generation_kwargs)
        if not generate_ref_response:
            return response
        with self._reference_context() as reference:
            reference = self.accelerator.unwrap_model(reference)
            ref_response = self._generate_with(reference, query_tensor, length_sampler, batch_size, return_prompt, generation_kwargs)
        return response, ref_response

    def _generate_with(self, model, query_tensor, length_sampler, batch_size, return_prompt, generation_kwargs):
        kwargs = dict(generation_kwargs)
        if isinstance(query_tensor, torch.Tensor):
            if length_sampler is not None:
                kwargs["max_new_tokens"] = length_sampler()
            query = query_tensor.to(self.current_device).unsqueeze(0)
            output = model.generate(input_ids=query, attention_mask=torch.ones_like(query), **kwargs)
            return output if return_prompt else output[:, query.shape[1]:]
        return self._generate_batched(model, list(query_tensor), length_sampler, batch_size, return_prompt, kwargs)

    def _generate_batched(self, model, queries, length_sampler, batch_size, return_prompt, kwargs, remove_padding=True):
        eos_token_id = getattr(self.tokenizer, "eos_token_id", None)
        outputs = []
        for begin in range(0, len(queries), batch_size):
            if length_sampler is not None:
                kwargs["max_new_tokens"] = length_sampler()
            chunk = [q.to(self.current_device) for q in queries[begin : begin + batch_size]]
            width = max(len(q) for q in chunk)
            input_ids = torch.stack([F.pad(q, (width - len(q), 0), value=self.pad_token_id) for q in chunk])
            attention_mask = torch.stack([F.pad(torch.ones_like(q), (width - len(q), 0)) for q in chunk])
            kwargs.setdefault("pad_token_id", self.pad_token_id)
            generations = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            for query, generation in zip(chunk, generations):
                prompt, generated = query, generation[width:]
                if remove_padding and eos_token_id is not None and (generated == eos_token_id).any():
                    # Cut after the first EOS *generated* (a chat prompt may itself contain the EOS token).
                    generated = generated[: int((generated == eos_token_id).nonzero()[0, 0]) + 1]
                outputs.append(torch.cat([prompt, generated]) if return_prompt else generated)
        return outputs

    # ---------------------------------------------------------------------------------------------
    # saving
    # ---------------------------------------------------------------------------------------------
    def save_pretrained(self, save_directory: str) -> None:
        """Save the policy (with its value head) and the tokenizer for ``from_pretrained``."""
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            self.accelerator.unwrap_model(self.model).save_pretrained(save_directory)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(save_directory)

    def save_checkpoint(self, output_dir: str) -> str:
        """Save everything needed to resume (see [`textenv.ppo.checkpoint.save_checkpoint`])."""
        from textenv.ppo.checkpoint import save_checkpoint

        return save_checkpoint(self, output_dir)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Restore a checkpoint written by [`save_checkpoint`] into this trainer."""
        from textenv.ppo.checkpoint import load_checkpoint

        load_checkpoint(self, checkpoint_dir)


def _launched_on_cpu_only() -> bool:
    import os

    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1 or int(os.environ.get("LOCAL_RANK", "-1")) != -1
    has_accelerator = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    return launched and not has_accelerator


def _rowwise_entropy(logits: torch.Tensor) -> torch.Tensor:
    """`[b, W, V]` -> `[b, W]` entropy, one row at a time to bound the temporary softmax."""
    return torch.stack([core.entropy_from_logits(row.float()) for row in logits])
