"""The measuring sections of `gpu_check.py`: model shapes, the generation paths on the Gym shape, and the PPO / GRPO
steps (full and LoRA) beside TRL's `GRPOTrainer` loss step on the same batch."""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

import gym_side

SHAPES = ("smollm2", "qwen3-0.6b", "qwen3-1.7b")
QWEN3 = dict(num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True, num_hidden_layers=28)
QWEN3_SIZES = {"qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072), "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144)}
TINY_LAYERS = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
ENGINES = ("textenv", "transformers", "vllm")


@dataclass
class Shape:
    """A model shape with random weights and the tokenizer of its vocabulary."""

    name: str
    model: Any
    tokenizer: Any


def build_shape(name: str, device: str, dtype: torch.dtype, tiny: bool) -> Shape:
    """A random-weight model of shape `name` (`SHAPES`) in `dtype` on `device`, and its real tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config

    from textenv.models import bundled_model_path, load_tokenizer

    if name == "smollm2":
        config, tokenizer = AutoConfig.from_pretrained(bundled_model_path()), load_tokenizer()
    else:
        config, tokenizer = Qwen3Config(**QWEN3, **QWEN3_SIZES[name]), qwen_tokenizer()
    if tiny:
        for key, value in TINY_LAYERS.items():
            setattr(config, key, value)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return Shape(name, model, tokenizer)


def qwen_tokenizer():
    """The real Qwen3 tokenizer vendored for the tests, wearing Qwen2.5's chat template (no thinking)."""
    from tests.chat_fixtures import real_template
    from tests.real_tokenizers import real_tokenizer

    tokenizer = copy.deepcopy(real_tokenizer("qwen"))
    tokenizer.chat_template = real_template("qwen2_5")
    tokenizer.eos_token, tokenizer.pad_token = "<|im_end|>", "<|endoftext|>"
    return tokenizer


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def reset_peak() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_memory_mib() -> float | None:
    """The peak GPU memory since `reset_peak` (MiB); `None` on a CPU."""
    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None


# ------------------------------------------------------------------------------------------------ generation
def generation_paths(shape: Shape, episodes: int, turns: int) -> list[dict]:
    """The Gym episodes of `gym_side` played by the per-turn `generate` loop and by GymScheduler on each engine:
    seconds, speed-up over the loop, episodes whose replies equal the loop's, the path; an engine that cannot run
    here says why."""
    runs = [("generate loop", lambda e, t: gym_side.run_naive(shape.model, shape.tokenizer, e, t))]
    runs += [(f"engine={engine}", _scheduler(shape, engine)) for engine in ENGINES]
    rows, reference = [], None
    for label, run in runs:
        try:
            run(2, 1)  # warm-up: kernels, CUDA graphs, the engine's probe
            synchronize()
            result = run(episodes, turns)
        except Exception as error:  # noqa: BLE001 - recorded: a path that cannot run here says why
            rows.append({"path": label, "error": _one_line(error)})
            continue
        reference = reference or result
        equal = sum(a == b for a, b in zip(result["replies"], reference["replies"]))
        rows.append({"path": label, "seconds": result["seconds"], "speedup": reference["seconds"] / result["seconds"],
                     "equal_episodes": f"{equal}/{episodes}", "decoding_path": result["decoding_path"]})
    return rows


def _scheduler(shape: Shape, engine: str) -> Callable[[int, int], dict]:
    def run(episodes: int, turns: int) -> dict:
        if engine == "vllm":
            import vllm  # noqa: F401 - only its absence is of interest here; a server needs more than this check
            raise RuntimeError("vLLM is installed but gpu_check does not start a vLLM server (see docs/guides/gpu.md)")
        return gym_side.run_scheduler(shape.model, shape.tokenizer, episodes, turns, engine=engine)

    return run


# ------------------------------------------------------------------------------------------------ training
def training_steps(shape: Shape, device: str, steps: int, tiny: bool) -> list[dict]:
    """PPO and GRPO steps, full and LoRA, on one random batch of `shape`: median seconds over `steps` timed steps
    after a warm-up, and peak GPU memory; TRL's `GRPOTrainer` loss step on the same batch where TRL imports."""
    batch = random_batch(shape.tokenizer, rows=8, query_tokens=32 if tiny else 128, response_tokens=16 if tiny else 128)
    rows = []
    for algorithm, method in (("ppo", "full"), ("ppo", "lora"), ("grpo", "full"), ("grpo", "lora"), ("trl-grpo", "full")):
        try:
            step = _step_function(algorithm, method, shape, device, batch)
            rows.append({"algorithm": algorithm, "method": method, **_timed(step, steps)})
        except Exception as error:  # noqa: BLE001 - recorded, the check goes on
            rows.append({"algorithm": algorithm, "method": method, "error": _one_line(error)})
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return rows


def random_batch(tokenizer, rows: int, query_tokens: int, response_tokens: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    high = min(len(tokenizer), 30000)
    prompt = torch.randint(100, high, (query_tokens,), generator=generator)
    return {"queries": [prompt.clone() for _ in range(rows)],  # groups share their prompt, as GRPO's do
            "responses": [torch.randint(100, high, (response_tokens,), generator=generator) for _ in range(rows)],
            "scores": [torch.tensor(float(index % 2)) for index in range(rows)]}


def _timed(step: Callable[[], None], steps: int) -> dict:
    step()  # warm-up
    synchronize()
    reset_peak()
    seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        step()
        synchronize()
        seconds.append(time.perf_counter() - started)
    return {"seconds": statistics.median(seconds), "peak_mib": peak_memory_mib()}


def _policy(shape: Shape, method: str):
    model = copy.deepcopy(shape.model).train()
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    return model


def _step_function(algorithm: str, method: str, shape: Shape, device: str, batch: dict) -> Callable[[], None]:
    accelerator = {"cpu": device == "cpu"}
    if algorithm == "ppo":
        from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer

        model = AutoModelForCausalLMWithValueHead.from_pretrained(_policy(shape, method)).to(device)
        trainer = PPOTrainer(PPOConfig(batch_size=8, mini_batch_size=8, ppo_epochs=1, accelerator_kwargs=accelerator), model, tokenizer=shape.tokenizer)
        return lambda: trainer.step(batch["queries"], batch["responses"], batch["scores"])
    if algorithm == "grpo":
        from textenv.grpo import GRPOConfig, GRPOTrainer

        trainer = GRPOTrainer(GRPOConfig(batch_size=8, mini_batch_size=8, num_generations=4, accelerator_kwargs=accelerator),
                              model=_policy(shape, method), tokenizer=shape.tokenizer)
        return lambda: trainer.step(batch["queries"], batch["responses"], batch["scores"])
    return _trl_grpo_step(shape, device, batch)


def _trl_grpo_step(shape: Shape, device: str, batch: dict) -> Callable[[], None]:
    """TRL's `GRPOTrainer` on the same batch: its loss (`compute_loss` on the padded prompt and completion ids and
    group advantages, as its `_prepare_inputs` hands them over), a backward pass and an optimizer step."""
    import tempfile

    try:
        import trl
        from datasets import Dataset
    except ImportError as error:
        raise RuntimeError(f"not installed ({error.name}): carry the wheels with make gpu-wheels") from error
    from textenv.grpo.core import group_advantages

    model = _policy(shape, "full")
    args = trl.GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, num_generations=4, beta=0.0, report_to=[],
                          use_cpu=device == "cpu", bf16=model.dtype == torch.bfloat16, learning_rate=1e-6)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=lambda completions, **kwargs: [0.0] * len(completions), args=args,
                              train_dataset=Dataset.from_list([{"prompt": "x"}] * 8), processing_class=shape.tokenizer)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's own loop, which this step stands outside of
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    prompt_ids, completion_ids = torch.stack(batch["queries"]).to(device), torch.stack(batch["responses"]).to(device)
    advantages, _ = group_advantages(torch.stack(batch["scores"]), 4, "group", None)
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
              "completion_mask": torch.ones_like(completion_ids), "advantages": advantages.to(device), "num_items_in_batch": torch.tensor(completion_ids.numel(), device=device)}

    def step() -> None:
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def _one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return text.splitlines()[0][:300]
