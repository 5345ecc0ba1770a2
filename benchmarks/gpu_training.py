"""The training section of `gpu_check.py`: PPO and GRPO steps, full fine-tuning and LoRA, on one prepared batch per
algorithm, and TRL's `GRPOTrainer` on the very same GRPO batch.

- PPO: `textenv.ppo.PPOTrainer.step` on the `ppo-step-varied` workload's batch (`workload.make_varied_ppo_batch`:
  8 rows, queries of 80-101 tokens, responses of 56-70 with a tool stretch masked), `ppo_epochs=4`, as
  `benchmarks/ppo_step.py` runs it (`--tiny`: 4 rows, one epoch);
- GRPO: `textenv.grpo.GRPOTrainer.step` with the `grpo-vs-trl` workload's settings (`grpo_settings.settings_mapping`:
  16 episodes in groups of 4, mini-batches of 4, one optimizer step), on rows shaped like that workload's: one
  648-token prompt per group, replies of 96-192 tokens with tool stretches masked;
- TRL: `trl.GRPOTrainer(...).train()` with the same settings (gradient checkpointing off, as on textenv's side), its
  episodes the same rows through TRL's `rollout_func` hook (prompt and completion ids, `env_mask` for the tool
  stretches) and its rewards the same scores: each training step pads, scores, computes the advantages and
  optimises as TRL does. Seconds between the ends of consecutive steps (the first step is the warm-up).

LoRA: rank 16 on the attention and MLP projections of every layer (`textenv.training.policy.lora_config`), on both
sides. Each row: a warm-up step, then the median of `steps` timed steps (`torch.cuda.synchronize` around each) and the
peak memory over them (`torch.cuda.max_memory_allocated`; on a CPU the process's peak RSS).
"""

from __future__ import annotations

import copy
import os
import random
import statistics
import tempfile
import time
from typing import Any, Callable

import torch

from gpu_sections import WHEELS_FIX, Shape, Unavailable, peak_memory, release_memory, reset_peak_memory, synchronize

ROWS = (("ppo", "full"), ("ppo", "lora"), ("grpo", "full"), ("grpo", "lora"), ("trl-grpo", "full"), ("trl-grpo", "lora"))
LORA = {"lora_layers": 0, "lora_rank": 16}  # grpo_settings: LoRA r=16 on every layer
TOKEN_IDS = 30000  # batch ids are drawn from [100, 30000): ordinary tokens of both vocabularies, the same batch for every shape
PPO_SIZES = {False: dict(rows=8, ppo_epochs=4), True: dict(rows=4, ppo_epochs=1)}
GRPO_SIZES = {False: dict(batch_size=16, num_generations=4, mini_batch_size=4, prompt=648, reply=(96, 192)),
              True: dict(batch_size=4, num_generations=2, mini_batch_size=2, prompt=24, reply=(8, 16))}


def training_rows(shape: Shape, device: str, tiny: bool, steps: int, run_row: Callable[..., None]) -> None:
    """One guarded row per `ROWS` entry (`run_row(label, work, algorithm=..., method=...)`)."""
    import workload

    ppo_batch = workload.make_varied_ppo_batch(TOKEN_IDS, rows=PPO_SIZES[tiny]["rows"])
    grpo = GRPO_SIZES[tiny]
    grpo_batch = make_grpo_batch(grpo)
    for algorithm, method in ROWS:
        work = {"ppo": lambda: _ppo(shape, device, method, ppo_batch, PPO_SIZES[tiny]["ppo_epochs"], steps),
                "grpo": lambda: _grpo(shape, device, method, grpo, grpo_batch, steps),
                "trl-grpo": lambda: _trl_grpo(shape, device, method, grpo, grpo_batch, steps)}[algorithm]
        run_row(f"{algorithm} {method}", work, algorithm=algorithm, method=method)


def make_grpo_batch(sizes: dict, seed: int = 0) -> dict[str, list]:
    """`batch_size` rows in groups of `num_generations` sharing a `prompt`-token prompt, replies of `reply` (low,
    high) tokens (a model third, a masked tool quarter, the rest the model's), scores in [0, 1)."""
    rng = random.Random(seed)
    batch: dict[str, list] = {"queries": [], "responses": [], "masks": [], "scores": []}
    for _ in range(sizes["batch_size"] // sizes["num_generations"]):
        prompt = [rng.randrange(100, TOKEN_IDS) for _ in range(sizes["prompt"])]
        for _ in range(sizes["num_generations"]):
            length = rng.randint(*sizes["reply"])
            model_part, tool_part = length // 3, length // 4
            batch["queries"].append(prompt)
            batch["responses"].append([rng.randrange(100, TOKEN_IDS) for _ in range(length)])
            batch["masks"].append([1] * model_part + [0] * tool_part + [1] * (length - model_part - tool_part))
            batch["scores"].append(rng.random())
    return batch


def _timed(step: Callable[[], Any], steps: int, **fields) -> dict:
    """A warm-up step, then `steps` timed ones: their median, every time, the peak memory over them."""
    step()
    synchronize()
    reset_peak_memory()
    seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        step()
        synchronize()
        seconds.append(time.perf_counter() - started)
    return {"seconds": statistics.median(seconds), "step_seconds": seconds, **peak_memory(), **fields}


def _fresh_accelerator() -> None:
    """accelerate keeps its device and mixed precision process-wide; each trainer here sets its own."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    release_memory()


def _trainable(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)


def _ppo(shape: Shape, device: str, method: str, batch: dict, ppo_epochs: int, steps: int) -> dict:
    import workload
    from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
    from textenv.training.policy import lora_config

    _fresh_accelerator()
    base = copy.deepcopy(shape.model)
    peft = {"peft_config": lora_config(LORA["lora_rank"], LORA["lora_layers"], base.config.num_hidden_layers)} if method == "lora" else {}
    model = AutoModelForCausalLMWithValueHead.from_pretrained(base, **peft).to(device)
    rows = len(batch["queries"])
    config = PPOConfig(batch_size=rows, mini_batch_size=rows, ppo_epochs=ppo_epochs, accelerator_kwargs={"cpu": device == "cpu"})
    trainer = PPOTrainer(config, model, tokenizer=shape.tokenizer)
    queries, responses, scores, masks = workload.ppo_batch_tensors(batch)
    return _timed(lambda: trainer.step(queries, responses, scores, response_masks=masks), steps, rows=len(queries),
                  ppo_epochs=config.ppo_epochs, trainable_parameters=_trainable(model))


def _grpo_settings(sizes: dict) -> dict:
    import grpo_settings

    keys = ("batch_size", "num_generations", "mini_batch_size")
    return {**grpo_settings.DEFAULTS, **{key: sizes[key] for key in keys}, "sides": ["textenv", "trl"]}


def _lora(model: torch.nn.Module, method: str):
    import grpo_settings

    return grpo_settings.with_lora(model, LORA) if method == "lora" else model


def _grpo(shape: Shape, device: str, method: str, sizes: dict, batch: dict, steps: int) -> dict:
    import grpo_settings

    try:
        from textenv.grpo import GRPOConfig, GRPOTrainer
    except ImportError as error:  # textenv.grpo imports trl.trainer.utils
        raise Unavailable(f"not available: {error} (textenv.grpo needs trl; {WHEELS_FIX})") from error
    _fresh_accelerator()
    mapping = grpo_settings.settings_mapping(_grpo_settings(sizes))["textenv"]["GRPOConfig"]
    config = GRPOConfig(**mapping, accelerator_kwargs={"cpu": device == "cpu"})
    model = _lora(copy.deepcopy(shape.model).train(), method)
    trainer = GRPOTrainer(config, model=model, tokenizer=shape.tokenizer)
    tensors = {key: [torch.tensor(value) for value in values] for key, values in batch.items()}
    return _timed(lambda: trainer.step(tensors["queries"], tensors["responses"], tensors["scores"], response_masks=tensors["masks"]),
                  steps, rows=len(batch["queries"]), packed=trainer.packed_config is not None, trainable_parameters=_trainable(model))


def _trl_grpo(shape: Shape, device: str, method: str, sizes: dict, batch: dict, steps: int) -> dict:
    """TRL's GRPOTrainer training `1 + steps` steps on the batch (see the module's docstring)."""
    import grpo_settings

    try:
        import trl
        from datasets import Dataset
    except ImportError as error:
        raise Unavailable(f"not installed ({error}): {WHEELS_FIX}") from error
    from packaging.version import Version
    from transformers import PrinterCallback, TrainerCallback

    if Version(trl.__version__) < Version("1.16"):
        raise Unavailable(f"not available: trl {trl.__version__} is installed; this row runs TRL 1.16's GRPOTrainer (rollout_func with env_mask): {WHEELS_FIX}")

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL 1.16
    _fresh_accelerator()
    settings = _grpo_settings(sizes)
    arguments = {**grpo_settings.settings_mapping(settings)["trl"]["GRPOConfig"], "max_steps": 1 + steps,
                 "max_completion_length": max(len(ids) for ids in batch["responses"]), "use_cpu": device == "cpu",
                 "bf16": shape.model.dtype == torch.bfloat16, "logging_steps": 1}
    seconds: list[float] = []
    clock: dict = {}

    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock["last"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            synchronize()
            now = time.perf_counter()
            seconds.append(now - clock["last"])
            clock["last"] = now
            if len(seconds) == 1:  # the warm-up step is over: the peak is measured over the timed ones
                reset_peak_memory()

    def rollout(prompts: list, trainer) -> dict:
        return {"prompt_ids": batch["queries"], "completion_ids": batch["responses"], "logprobs": None, "env_mask": batch["masks"]}

    def fixed_rewards(completions, **kwargs) -> list[float]:
        return list(batch["scores"])

    prompts = (1 + steps) * sizes["batch_size"] // sizes["num_generations"]
    model = copy.deepcopy(shape.model).train()
    with tempfile.TemporaryDirectory(prefix="gpu-check-trl-") as output_dir:
        trainer = trl.GRPOTrainer(model=model, reward_funcs=[fixed_rewards], args=trl.GRPOConfig(output_dir=output_dir, **arguments),
                                  train_dataset=Dataset.from_list([{"prompt": f"prompt {index}"} for index in range(prompts)]),
                                  processing_class=shape.tokenizer, rollout_func=rollout, callbacks=[StepClock()],
                                  peft_config=grpo_settings.lora_settings(model, LORA) if method == "lora" else None)
        trainer.remove_callback(PrinterCallback)  # its log lines (logging_steps=1, as in grpo-vs-trl) stay in TRL
        trainer.train()
    timed = seconds[1:]
    return {"seconds": statistics.median(timed), "step_seconds": timed, **peak_memory(), "rows": len(batch["queries"]),
            "trl": trl.__version__, "trainable_parameters": _trainable(trainer.model)}
