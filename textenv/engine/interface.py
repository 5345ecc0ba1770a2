"""The engine interface: what every backend provides to the front ends (TextEnvironment, GymScheduler, the
training loop), and `Completion`, what a turn returns.

Three backends implement it: textenv's in-process engine (`textenv.engine.engine.GenerationEngine`),
transformers' continuous batching (`textenv.engine.transformers_cb.TransformersEngine`) and vLLM
(`textenv.vllm.engine.VLLMEngine`, servers or colocated). `textenv.engine.backends.build_engine` builds one by
name. A backend generates turns from exact token ids (the next turn extends the ids sampled before, never a
re-tokenised text), stops them at stop strings or end ids, returns the exact ids (and log-probs where it has
them), serves the model's current weights, and says which path decodes (`decoding_path`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Hashable, Iterable, Protocol, Sequence, runtime_checkable

import torch

# The most episodes decoded together, on every backend and through every front end (finished ones make room).
DEFAULT_GENERATION_BATCH_SIZE = 32


@dataclass
class Completion:
    """One generated turn.

    Attributes:
        token_ids (`torch.LongTensor`): the generated ids, 1-D, up to and including the stop token.
        text (`str`): their decoded text (special tokens kept).
        finish_reason (`str`): `"stop"` (a stop string), `"eos"` or `"length"` (token budget reached).
        logprobs (`torch.FloatTensor`, *optional*): the log-probability the engine gave each generated
            token when it sampled it, 1-D like `token_ids`; `None` when the engine does not report them (the
            in-process engine). The vLLM and transformers backends report them.
        policy_version (`int`, *optional*): the version of the weights that sampled the turn (the training
            loop's count of optimizer steps; `None` outside a training loop).
    """

    token_ids: torch.Tensor
    text: str
    finish_reason: str
    logprobs: torch.Tensor | None = None
    policy_version: int | None = None


@runtime_checkable
class Engine(Protocol):
    """The contract of a generation backend.

    Attributes:
        model: the policy whose weights the turns are sampled from; may be replaced between calls.
        tokenizer: its tokenizer.
        batch_size (`int`): the most turns decoded at the same time; the front ends set it before each run.
        policy_version (`int`, *optional*): stamped on every `Completion` (the training loop sets it).
        decoding_path: what decodes the turns; ``str(engine.decoding_path)`` names it, and
            ``engine.decoding_path.reason`` says why a faster path is not used (empty when none is missed).
    """

    model: Any
    tokenizer: Any
    batch_size: int
    policy_version: int | None

    @property
    def decoding_path(self) -> Any: ...

    async def generate(
        self,
        context_ids: torch.Tensor,
        stop_strings: Iterable[str] = (),
        generation_kwargs: dict | None = None,
        *,
        episode: Hashable | None = None,
    ) -> Completion:
        """One turn from the exact ids `context_ids` (1-D); returns when this turn is done, others go on.
        `episode` keys the episode's cached prefix until `end_episode(episode)`."""
        ...

    def generate_batch(
        self,
        contexts: Sequence[torch.Tensor],
        stop_strings: Iterable[str] = (),
        generation_kwargs: dict | None = None,
        batch_size: int | None = None,
        stop_at_eos: bool = True,
    ) -> list[Completion]:
        """One turn for every context, waiting for all of them (the legacy lockstep order)."""
        ...

    def end_episode(self, episode: Hashable) -> None:
        """The episode asks for no more turns: what the backend keeps for it can go."""
        ...

    def run_hosted(self, coroutine: Awaitable) -> Any:
        """Run `coroutine` (episodes that call `generate`) to completion and return its result."""
        ...
