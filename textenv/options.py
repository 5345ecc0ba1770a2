"""The options every `textenv` command and example shares, and the defaults they agree on.

Options are dataclasses parsed by `textenv.parsing.parse_options` (TRL's `TrlParser`: ``--config run.yaml``,
both spellings of every option, the aliases ``--model`` / ``--lora`` / ``--lora_rank``; re-exported here).

- `EpisodeArguments`: how episodes are played (device, turns, tokens per turn, temperature, tool format, ...);
  `textenv.training.Settings` extends it, so the demo and the examples take the same options as
  `textenv rollout` and `textenv train`.
- `GymArguments`: where Gym episodes come from (the dataset, the env or a TRL environment class, plugins, the
  scheduler's limits).
- `CommandArguments`: logging and progress bars; `ExampleArguments`: what the example scripts add.

The training defaults of the commands, the demo and the examples (`DEFAULT_TRAINING_STEPS` steps of
`DEFAULT_BATCH_SIZE` episodes in mini-batches of at most `DEFAULT_MINI_BATCH_SIZE`, `DEFAULT_PPO_EPOCHS` pass) are the demo's, and
`default_mini_batch_size` gives the mini-batch for any batch size, so that no default pair is one the
trainers refuse.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from textenv.engine.backends import DEFAULT_GENERATION_BATCH_SIZE, ENGINES, VLLM_MODES
from textenv.logs import LOG_LEVELS
from textenv.parsing import ALIAS_GROUPS, HelpFormatter, parse_options, with_aliases  # noqa: F401 - re-exported
from textenv.gym_options import GymArguments  # noqa: F401 - re-exported, with the other options

logger = logging.getLogger(__name__)

TOOL_FORMATS = ("tags", "json")
MIXED_PRECISIONS = ("bf16", "fp16")
DEFAULT_MAX_NEW_TOKENS = {"tags": 24, "json": 48}  # a JSON call of the calculator is about 34 tokens
DEFAULT_MAX_TURNS = 3  # the commands', the demo's and the examples' (see docs/guides/cli.md for each front end's)
DEFAULT_BATCH_SIZE = 16  # episodes per training step
DEFAULT_MINI_BATCH_SIZE = 4  # the largest mini-batch a default gives
DEFAULT_TRAINING_STEPS = 20
DEFAULT_PPO_EPOCHS = 1  # optimisation passes over each batch (legacy PPOConfig's 4 apply in Python)
DEFAULT_VALUE_HEAD_INIT_STD = 1e-3  # a new value head's weights ~ N(0, this): its first values about 0 (see Settings)


def default_mini_batch_size(batch_size: int, gradient_accumulation_steps: int = 1) -> int:
    """The mini-batch size a run gets when none is given: the largest size up to `DEFAULT_MINI_BATCH_SIZE` that
    splits a batch of `batch_size` episodes into optimizer steps of `gradient_accumulation_steps` whole
    mini-batches (16 -> 4, 6 -> 3, 2 -> 2); `DEFAULT_MINI_BATCH_SIZE` where none does, for the trainer's
    message to name the fix."""
    if batch_size < 1 or gradient_accumulation_steps < 1 or batch_size % gradient_accumulation_steps:
        return DEFAULT_MINI_BATCH_SIZE
    per_step = batch_size // gradient_accumulation_steps
    return max(size for size in range(1, DEFAULT_MINI_BATCH_SIZE + 1) if per_step % size == 0)



@dataclass
class EpisodeArguments:
    """How the policy plays episodes: shared by `textenv rollout`, `textenv train`, the demo and the examples."""

    device: str = field(default="cpu", metadata={"help": "torch device of the policy (cpu, cuda, ...)"})
    max_turns: Optional[int] = field(default=None, metadata={"help": "model turns per episode (0: no limit; default 3; verifiers environments: "
                                                                 "their own, set with --env_args)"})
    max_new_tokens: Optional[int] = field(
        default=None,
        metadata={"help": "tokens per model turn (default: 24 with tag tool calls, 48 with JSON ones; a Gym episode whose env offers JSON "
                          "tools, --environment_factory's among them, gets at least what its longest tool call needs)"},
    )
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the rollouts; 0 decodes greedily"})
    generation_batch_size: int = field(
        default=DEFAULT_GENERATION_BATCH_SIZE, metadata={"help": "the most episodes decoded together (finished ones make room for the next)"}
    )
    mixed_precision: Optional[str] = field(
        default=None, metadata={"help": "'bf16' or 'fp16': rollouts and PPO steps in autocast, weights float32 ('no' or unset: float32)"}
    )
    tool_format: str = field(default="tags", metadata={"help": "'tags' (<request><Tool>...<call>) or 'json' (the chat template's tool calls)"})
    tool_parser: Optional[str] = field(default=None, metadata={"help": "JSON tool calls: the call format (hermes, qwen3_coder, glm4, gpt_oss, "
                                                                   "pythonic, ...: textenv check-model lists it; default: the chat template's)"})
    chat_template: Optional[str] = field(default=None, metadata={"help": "JSON tool calls: a Jinja chat template file used instead of the "
                                                                     "tokenizer's (e.g. TRL's training template of the family)"})
    engine: str = field(default="textenv", metadata={"help": "what generates the turns: 'textenv' (in-process engine), 'transformers' "
                                                             "(transformers' continuous batching), 'vllm', or 'auto' (by device; the "
                                                             "path is logged)"})
    vllm_server_url: Optional[str] = field(
        default=None, metadata={"help": "--engine vllm: the server(s), comma-separated (none: textenv starts one for the model, see `textenv serve`)"}
    )
    vllm_mode: str = field(default="server", metadata={"help": "--engine vllm: 'server' (HTTP) or 'colocate' (vLLM in this process)"})
    vllm_gpu_memory_utilization: Optional[float] = field(
        default=None, metadata={"help": "--vllm_mode colocate on a GPU: vLLM's share of its memory (default 0.3, TRL's; the rest is the trainer's)"}
    )
    vllm_enable_sleep_mode: bool = field(
        default=False,
        metadata={"help": "--vllm_mode colocate on a GPU: vLLM releases its memory while the trainer steps (weights offloaded, KV cache "
                          "dropped) and takes it back for the next episodes; not with --max_staleness >= 1"},
    )
    vllm_dtype: str = field(
        default="float32",
        metadata={"help": "--engine vllm without --vllm_server_url: the started (or colocated) vLLM's --dtype (float32: the tokens of the trained "
                          "float32 policy; auto: float32 on a CPU without native bf16, else vLLM's choice, bf16; the choice is logged)"},
    )

    def __post_init__(self) -> None:
        if self.tool_format not in TOOL_FORMATS:
            raise ValueError(f"--tool_format must be one of {list(TOOL_FORMATS)}, got {self.tool_format!r}.")
        if self.mixed_precision == "no":
            self.mixed_precision = None
        if self.mixed_precision not in (None, *MIXED_PRECISIONS):
            raise ValueError(f"--mixed_precision must be no, bf16 or fp16, got {self.mixed_precision!r}.")
        if self.temperature < 0:
            raise ValueError(f"--temperature must be >= 0 (0: greedy), got {self.temperature}.")
        from textenv.chat.templates import read_chat_template

        self.chat_template_text = read_chat_template(self.chat_template)
        self.max_turns_given = self.max_turns is not None
        if self.max_turns is None:
            self.max_turns = DEFAULT_MAX_TURNS
        # Whether --max_new_tokens was given: without it, Gym episodes with JSON tools get what their calls need.
        self.max_new_tokens_given = self.max_new_tokens is not None
        if self.max_new_tokens is None:
            self.max_new_tokens = DEFAULT_MAX_NEW_TOKENS[self.tool_format]
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {list(ENGINES)}, got {self.engine!r}.")
        if self.vllm_mode not in VLLM_MODES:
            raise ValueError(f"--vllm_mode must be one of {list(VLLM_MODES)}, got {self.vllm_mode!r}.")
        colocated_only = [name for name, value in (("--vllm_gpu_memory_utilization", self.vllm_gpu_memory_utilization),
                                                   ("--vllm_enable_sleep_mode", self.vllm_enable_sleep_mode)) if value]
        if colocated_only and (self.engine != "vllm" or self.vllm_mode != "colocate"):
            raise ValueError(f"{' and '.join(colocated_only)} set(s) vLLM in the training process: add --engine vllm --vllm_mode colocate.")

    def engine_options(self, model) -> dict[str, Any]:
        """The front ends' engine arguments (`engine`, `vllm_server_url`, `vllm_mode`, `mixed_precision`). With
        `--engine vllm` in server mode and no `--vllm_server_url`, a vLLM server for `model`'s folder is started
        (once per process, stopped at exit; `textenv.vllm.server.shared_server`)."""
        if self.engine == "transformers" and self.mixed_precision:
            logger.warning("--engine transformers decodes in the model's own dtype; --mixed_precision %s applies to the training step only.",
                           self.mixed_precision)
            return {"engine": self.engine, "mixed_precision": None}
        if self.engine != "vllm":
            return {"engine": self.engine, "mixed_precision": self.mixed_precision}
        url = self.vllm_server_url
        if url is None and self.vllm_mode == "server":
            from textenv.vllm.server import model_folder, shared_server

            url = shared_server(model_folder(model), self.vllm_dtype).url
        # The PPO step still runs in --mixed_precision; the server decodes in its own dtype.
        options = {"engine": "vllm", "vllm_server_url": url, "vllm_mode": self.vllm_mode, "mixed_precision": None}
        if self.vllm_mode == "colocate":
            llm_kwargs: dict[str, Any] = {"sleep_mode": self.vllm_enable_sleep_mode, "dtype": self.vllm_dtype}
            if self.vllm_gpu_memory_utilization is not None:
                llm_kwargs["gpu_memory_utilization"] = self.vllm_gpu_memory_utilization
            options["vllm_kwargs"] = {"llm_kwargs": llm_kwargs}
        return options

    def generation_kwargs(self) -> dict[str, Any]:
        """`generate` keyword arguments: the legacy examples' sampling (no top-k / top-p) at `temperature`,
        or greedy at 0 (`textenv.training.SAMPLING_KWARGS` / `GREEDY_KWARGS`)."""
        from textenv.training.evaluation import GREEDY_KWARGS, SAMPLING_KWARGS

        mode = GREEDY_KWARGS if self.temperature == 0 else {**SAMPLING_KWARGS, "temperature": self.temperature}
        return {**mode, "max_new_tokens": self.max_new_tokens}


def log_generation_path(front_end) -> None:
    """Log what generates the episodes' turns (`--engine`), building the engine now: a setting the engine cannot
    keep stops the command here, before any episode."""
    logger.info("generation: %s", front_end.decoding_path)


@dataclass
class CommandArguments:
    """Logging and progress bars."""

    log_level: str = field(default="info", metadata={"help": f"one of {', '.join(LOG_LEVELS)} (other ranks: warning)"})
    no_progress: bool = field(default=False, metadata={"help": "no progress bars"})

    def __post_init__(self) -> None:
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"--log_level must be one of {list(LOG_LEVELS)}, got {self.log_level!r}.")


@dataclass
class ExampleArguments:
    """What the example scripts add to the training `Settings`."""

    log_dir: str = field(default="runs", metadata={"help": "tensorboard logging_dir"})
    save_dir: Optional[str] = field(default=None, metadata={"help": "save the trained model (adapters + value head) here"})
    show: int = field(default=2, metadata={"help": "evaluation episodes to print with show_text"})
