"""The generation engine's front door: `GenerationEngine`, every episode's next turn, served with continuous
batching. It builds each request (settings, stop rules, the episode's cache key) and turns the ids decoded into a
`Completion`; `scheduler.py` holds the waiting requests and decides what to admit, `worker.py` is the decoding
thread (and hosting it in the caller's thread), `decoding.py` its loop.

An episode asks for its next turn with one call, ``await engine.generate(context_ids, stop_strings,
generation_kwargs, episode=key)``. One decoding thread serves every waiting request: requests made in the
same event-loop iteration are admitted together, into the decoding batch at the next step (at once into an
empty batch, else as soon as a quarter of its rows are free: admitting copies the batch's KV); a finished
row's turn is returned at once; and an episode's KV cache is kept for its next turn (only the tokens
appended since are run through the model) until `end_episode(key)`. A prompt prefix shared by rows
admitted together is computed once. Each row stops at its own stop strings or EOS,
keeping exactly the tokens up to and including the one that completed its stop.

For greedy and plain sampled decoding (temperature, top-k, top-p, min_new_tokens) on models with a plain
KV cache the engine runs its own loop (`decoding.py`); greedy results are the tokens `transformers`'
`generate` gives (up to float rounding). Whether a model qualifies is probed once (`fast_path.py`);
`engine.fast_path` / `engine.decoding_path` tell which path runs. Anything else is served by `generate`
itself, in batches of the waiting requests with the same settings (`hf_generate.py`), and a warning is
logged once per model (or per unsupported setting) with the reason. `generate_batch` is the same service for a
list of contexts at once (the legacy lockstep turn order).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from functools import partial
from typing import Any, Awaitable, Hashable, Iterable, Sequence

import torch

from textenv.engine import worker
from textenv.engine.decoding import DecodeRequest
from textenv.engine.fast_path import FALLBACK_COST, GENERATE, LOOP, DecodingPath, decoding_path
from textenv.engine.hf_generate import HFGenerateRequest
from textenv.engine.interface import DEFAULT_GENERATION_BATCH_SIZE, Completion
from textenv.engine.precision import autocast_dtype, decoding_autocast
from textenv.engine.prefix_cache import PrefixCache
from textenv.engine.sampling import DEFAULT_MAX_NEW_TOKENS, SamplingSettings
from textenv.engine.scheduler import RequestScheduler
from textenv.engine.stopping import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, StopChecker
from textenv.engine.unwrapping import decoding_model, model_device, unwrap_model  # noqa: F401 - model_device re-exported
from textenv.padding import ensure_pad_token, left_pad

logger = logging.getLogger(__name__)

__all__ = ["Completion", "DEFAULT_MAX_NEW_TOKENS", "GenerationEngine", "left_pad", "unwrap_model", "FINISH_EOS", "FINISH_LENGTH", "FINISH_STOP"]


class GenerationEngine:
    """Generates model turns for many episodes at once.

    Args:
        model: a causal LM, or a value-head wrapper around one (`.pretrained_model`), possibly wrapped by
            accelerate/DDP or PEFT. May be replaced between calls (`engine.model = ...`).
        tokenizer: its tokenizer. A missing pad token is set to EOS (with a warning).
        generation_kwargs (`dict`, *optional*): generation settings for every call (`do_sample`, `top_k`,
            `max_new_tokens`, ...), as for `model.generate`. The dict is read, never modified. Without
            `max_new_tokens` or `max_length`, `max_new_tokens=32` is used.
        batch_size (`int`, defaults to 32): the most rows decoded at the same time (finished rows make
            room for waiting ones).
        reuse_cache (`bool`, defaults to `True`): reuse cached prefixes (an episode's previous turns, a
            shared prompt). The cache is dropped automatically when the model's weights change. `False`
            recomputes every context from scratch.
        mixed_precision (`str`, *optional*): `"bf16"` or `"fp16"` decodes under `torch.autocast` in that dtype
            (weights kept as they are; greedy tokens follow the half-precision model); `None` or `"no"` (default):
            the model's own dtype. Meant for GPUs: on CPUs it measured slower than float32, with native bf16 too
            (see docs/guides/ppo.md), and a CPU that emulates bf16 gets a warning with the cost (`textenv.hardware`).
    """

    def __init__(
        self,
        model,
        tokenizer,
        generation_kwargs: dict | None = None,
        batch_size: int = DEFAULT_GENERATION_BATCH_SIZE,
        reuse_cache: bool = True,
        mixed_precision: str | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.generation_kwargs = generation_kwargs if generation_kwargs is not None else {}
        self.batch_size = batch_size
        self.reuse_cache = reuse_cache
        self.autocast_dtype = autocast_dtype(mixed_precision)
        self.prefix_cache = PrefixCache()
        self.policy_version: int | None = None  # stamped on every Completion; the training loop sets it
        ensure_pad_token(tokenizer)
        self.scheduler = RequestScheduler(self.prefix_cache, reuse_cache)
        self._stop_checkers: dict[tuple, StopChecker] = {}
        self._warned_settings: set[str] = set()

    @property
    def _worker(self) -> threading.Thread | None:
        """The thread decoding now, if any."""
        return self.scheduler.worker

    @property
    def decoding_path(self) -> DecodingPath:
        """How the current model's turns are decoded (probed once per model, see `fast_path.py`); a
        generation setting the loop does not implement still sends its turns to `generate`."""
        return self._probed_path(decoding_model(self.model))

    @property
    def fast_path(self) -> bool:
        """Whether the engine's own decoding loop serves the current model (`False`: `generate` does)."""
        return self.decoding_path.fast

    # ------------------------------------------------------------------------------ requests
    async def generate(
        self,
        context_ids: torch.Tensor,
        stop_strings: Iterable[str] = (),
        generation_kwargs: dict | None = None,
        *,
        episode: Hashable | None = None,
    ) -> Completion:
        """Generate one turn from `context_ids`; returns when this row is done (other rows go on).

        Args:
            context_ids (`torch.LongTensor`): the episode's token ids so far, 1-D.
            stop_strings: the turn stops once its new text contains any of these.
            generation_kwargs: overrides for this turn, merged over the engine's.
            episode (`Hashable`, *optional*): the episode's key. Its KV cache is kept for its next turn
                until `end_episode(episode)`.

        Raises:
            Exception: whatever the model raised while this row was being decoded.
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def done(token_ids, outcome) -> None:
            try:
                loop.call_soon_threadsafe(_resolve, future, token_ids, outcome)
            except RuntimeError:  # the episode's event loop has closed (its run was interrupted)
                pass

        request = self._request(context_ids, stop_strings, generation_kwargs, done, episode, stop_at_eos=True)
        self.scheduler.stage(loop, request, self._start_worker)
        token_ids, finish_reason = await future
        return self._completion(token_ids, finish_reason, context_ids.device)

    def generate_batch(
        self,
        contexts: Sequence[torch.Tensor],
        stop_strings: Iterable[str] = (),
        generation_kwargs: dict | None = None,
        batch_size: int | None = None,
        stop_at_eos: bool = True,
    ) -> list[Completion]:
        """Generate one turn for every context and wait for all of them (the same service as `generate`).

        Args:
            contexts: each episode's token ids so far (1-D tensors; lengths may differ).
            stop_strings, generation_kwargs: as for `generate`.
            batch_size: rows decoded together for this call (default: the engine's).
            stop_at_eos: stop a row at the tokenizer's EOS token even if `generation_kwargs` says
                `eos_token_id=-1` (the legacy examples' setting).

        Returns:
            One `Completion` per context, in order.
        """
        if len(contexts) == 0:
            return []
        results: list[Any] = [None] * len(contexts)
        finished = threading.Semaphore(0)

        def collector(index: int):
            def done(token_ids, outcome) -> None:
                results[index] = (token_ids, outcome)
                finished.release()

            return done

        requests = [
            self._request(context, stop_strings, generation_kwargs, collector(index), None, stop_at_eos)
            for index, context in enumerate(contexts)
        ]
        self.scheduler.submit(requests, partial(self._start_worker, batch_size))
        for _ in requests:
            finished.acquire()
        self.scheduler.end_call()
        for token_ids, outcome in results:
            if token_ids is None:
                raise outcome
        return [self._completion(ids, reason, context.device) for (ids, reason), context in zip(results, contexts)]

    def end_episode(self, episode: Hashable) -> None:
        """The episode will ask for no more turns: its cached KV can go."""
        self.scheduler.end_episode(episode)

    # ------------------------------------------------------------------------------ serving
    def _request(self, context, stop_strings, generation_kwargs, done, owner, stop_at_eos: bool):
        kwargs = {**self.generation_kwargs, **(generation_kwargs or {})}
        settings = self._loop_settings(decoding_model(self.model), kwargs)
        fast = settings is not None
        checker = self._stop_checker(tuple(stop_strings), settings if fast else None, stop_at_eos)
        context = context.detach().to("cpu", torch.long)
        done = worker.reported_once(done)
        if fast:
            stream = getattr(owner, "random_stream", None)  # an episode's key carries its own randomness
            return DecodeRequest(context, settings, checker, done, owner=owner if self.reuse_cache else None, stream=stream)
        return HFGenerateRequest(context, kwargs, checker, done)

    def _loop_settings(self, model, kwargs: dict) -> SamplingSettings | None:
        """The loop's settings for a turn with `kwargs`, or `None` when `generate` must serve it (the model
        does not qualify, or a setting is not implemented: logged once per setting)."""
        if not self._probed_path(model).fast:
            return None
        generation_config = getattr(model, "generation_config", None)
        settings = SamplingSettings.from_kwargs(generation_config, kwargs, DEFAULT_MAX_NEW_TOKENS)
        if settings is None:
            setting = SamplingSettings.unsupported_setting(generation_config, kwargs)
            if setting not in self._warned_settings:
                self._warned_settings.add(setting)
                logger.warning("Turns generated with %s are served by %s, not by %s (it does not implement that setting). Cost: %s.", setting, GENERATE, LOOP, FALLBACK_COST)
        return settings

    def _stop_checker(self, stop_strings: tuple, settings: SamplingSettings | None, stop_at_eos: bool) -> StopChecker:
        stop_ids = {int(self.tokenizer.eos_token_id)} if stop_at_eos and self.tokenizer.eos_token_id is not None else set()
        if settings is not None:
            stop_ids |= settings.eos_token_ids
        key = (stop_strings, frozenset(stop_ids), id(self.tokenizer))
        if key not in self._stop_checkers:
            self._stop_checkers[key] = StopChecker(self.tokenizer, list(stop_strings), stop_ids)
        return self._stop_checkers[key]

    def run_hosted(self, coroutine: Awaitable) -> Any:
        """Run `coroutine` (episodes that generate with this engine) to completion and return its result,
        decoding in the calling thread while the episodes' event loop runs in a helper thread
        (`textenv.engine.worker.run_hosted`)."""
        return worker.run_hosted(self, coroutine)

    def _start_worker(self, batch_size: int | None = None) -> threading.Thread:
        """A decoding thread of `batch_size` rows (default: the engine's, read now), for the scheduler to start."""
        return worker.start_worker(self, batch_size or self.batch_size)

    def _probed_path(self, model) -> DecodingPath:
        """`decoding_path(model)`, probed (once per model) in the precision this engine decodes in, so that the
        probe's two tiny forwards run as the loop's would."""
        if not isinstance(model, torch.nn.Module) or next(model.parameters(), None) is None:
            return decoding_path(model)
        with self._autocast(model):
            return decoding_path(model)

    def _autocast(self, model) -> torch.autocast:
        # One context for the whole serving loop: autocast keeps the half-precision copy of each weight until
        # it exits, so weights are cast once per call, not once per decoding step.
        return decoding_autocast(model, self.autocast_dtype)

    def _completion(self, token_ids: list[int] | torch.Tensor, reason: str, device: torch.device) -> Completion:
        token_ids = torch.as_tensor(token_ids, dtype=torch.long).to(device)
        text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
        return Completion(token_ids=token_ids, text=text, finish_reason=reason, policy_version=self.policy_version)


def _resolve(future: asyncio.Future, token_ids, outcome) -> None:
    if future.done():  # the episode was cancelled while its row was decoding
        return
    if token_ids is None:
        future.set_exception(outcome)
    else:
        future.set_result((token_ids, outcome))


RolloutEngine = GenerationEngine  # the name before the engine served single requests
