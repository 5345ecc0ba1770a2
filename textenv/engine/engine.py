"""The generation engine: every episode's next turn, served with continuous batching.

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
from typing import Any, Awaitable, Hashable, Iterable, Sequence

import torch

from textenv.asyncio_bridge import run_sync
from textenv.engine.backends import DEFAULT_GENERATION_BATCH_SIZE
from textenv.engine.decoding import ContinuousDecoder, DecodeRequest
from textenv.engine.fast_path import FALLBACK_COST, GENERATE, LOOP, DecodingPath, decoding_path
from textenv.engine.interface import Completion
from textenv.engine.hf_generate import HFGenerateRequest, serve_with_hf
from textenv.engine.precision import autocast_dtype, decoding_autocast
from textenv.engine.prefix_cache import PrefixCache
from textenv.engine.sampling import SamplingSettings
from textenv.engine.stopping import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, StopChecker
from textenv.engine.unwrapping import decoding_model, model_device, unwrap_model
from textenv.padding import ensure_pad_token, left_pad

DEFAULT_MAX_NEW_TOKENS = 32
logger = logging.getLogger(__name__)

__all__ = ["Completion", "GenerationEngine", "left_pad", "unwrap_model", "FINISH_EOS", "FINISH_LENGTH", "FINISH_STOP"]


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
        self._lock = threading.Lock()
        self._waiting: list[DecodeRequest | HFGenerateRequest] = []
        self._ended: list[Hashable] = []
        self._worker: threading.Thread | None = None  # the thread decoding now, if any
        self._wakeup = threading.Condition(self._lock)
        self._hosted_until: threading.Event | None = None
        self._stop_checkers: dict[tuple, StopChecker] = {}
        self._staged: dict[asyncio.AbstractEventLoop, list] = {}
        self._warned_settings: set[str] = set()

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

        self._stage(loop, self._request(context_ids, stop_strings, generation_kwargs, done, episode, stop_at_eos=True))
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
        self._submit(requests, batch_size=batch_size)
        for _ in requests:
            finished.acquire()
        with self._lock:
            self.prefix_cache.end_call()
        for token_ids, outcome in results:
            if token_ids is None:
                raise outcome
        return [self._completion(ids, reason, context.device) for (ids, reason), context in zip(results, contexts)]

    def end_episode(self, episode: Hashable) -> None:
        """The episode will ask for no more turns: its cached KV can go."""
        with self._lock:
            if self._worker is None:
                self.prefix_cache.release(episode)
            else:  # the decoding thread owns the cache while it runs
                self._ended.append(episode)

    # ------------------------------------------------------------------------------ serving
    def _request(self, context, stop_strings, generation_kwargs, done, owner, stop_at_eos: bool):
        kwargs = {**self.generation_kwargs, **(generation_kwargs or {})}
        settings = self._loop_settings(decoding_model(self.model), kwargs)
        fast = settings is not None
        checker = self._stop_checker(tuple(stop_strings), settings if fast else None, stop_at_eos)
        context = context.detach().to("cpu", torch.long)
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

    def _stage(self, loop: asyncio.AbstractEventLoop, request) -> None:
        """Hand `request` to the decoding thread at the end of this event-loop iteration, together with
        every other request made in it (episodes whose turns ended together ask together, so they are
        admitted, and their shared prefix computed, as one group)."""
        staged = self._staged.setdefault(loop, [])
        staged.append(request)
        if len(staged) == 1:
            loop.call_soon(lambda: self._submit(self._staged.pop(loop)))

    def run_hosted(self, coroutine: Awaitable) -> Any:
        """Run `coroutine` (episodes that generate with this engine) to completion and return its result,
        decoding in the calling thread while the episodes' event loop runs in a helper thread.

        Decoding in the thread that set up torch is faster than in a second one: on a machine with few
        cores, a second thread's OpenMP team makes every team wait passively (about 20% slower here).
        Falls back to `run_sync` (decoding in the engine's own thread) when another call is decoding.
        """
        # Probe now, before the episodes' thread starts: the probe keeps torch's random state by saving and
        # restoring it, which would undo a draw the episodes made meanwhile.
        self._probed_path(decoding_model(self.model))
        with self._lock:
            busy = self._worker is not None
            if not busy:
                self._worker, self._hosted_until = threading.current_thread(), threading.Event()
        if busy:
            return run_sync(coroutine)
        finished = self._hosted_until
        outcome: dict[str, Any] = {}

        def episodes() -> None:
            try:
                outcome["result"] = run_sync(coroutine)
            except BaseException as error:  # noqa: BLE001 - re-raised in the calling thread
                outcome["error"] = error
            finally:
                with self._lock:
                    finished.set()
                    self._wakeup.notify_all()

        helper = threading.Thread(target=episodes, name="textenv-episodes", daemon=True)
        helper.start()
        self._serve(self.batch_size)
        helper.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    def _submit(self, requests: list, batch_size: int | None = None) -> None:
        with self._lock:
            self._waiting.extend(requests)
            self._wakeup.notify_all()
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._serve, args=(batch_size or self.batch_size,), name="textenv-engine", daemon=True
                )
                self._worker.start()

    def _serve(self, max_rows: int) -> None:
        """The decoding thread: admit, step, retire, until nothing is running or waiting."""
        model, fast_model = unwrap_model(self.model), decoding_model(self.model)
        cache_argument = self._probed_path(fast_model).cache_argument
        decoder = ContinuousDecoder(fast_model, self.prefix_cache, self.tokenizer.pad_token_id, max_rows, cache_argument, self.reuse_cache)
        try:
            with torch.inference_mode(), self._autocast(model):
                while True:
                    admitted, fallback = self._take_waiting(decoder, fast_model)
                    if admitted is None:
                        return
                    try:
                        if fallback:
                            serve_with_hf(model, self.tokenizer.pad_token_id, fallback, DEFAULT_MAX_NEW_TOKENS)
                        decoder.admit(admitted)
                        if decoder.batch is not None:
                            decoder.step()
                    except Exception as error:  # noqa: BLE001 - reported to every row it concerns
                        for request in admitted:
                            if request not in (decoder.batch.requests if decoder.batch else []):
                                request.done(None, error)
                        decoder.fail(error)
        except BaseException as error:  # never leave requests waiting on a thread that is gone
            with self._lock:
                stranded, self._waiting, self._worker, self._hosted_until = self._waiting, [], None, None
            for request in stranded:
                request.done(None, error)
            raise

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

    def _take_waiting(self, decoder: ContinuousDecoder, model) -> tuple[list | None, list]:
        """The requests to admit now (`None`: nothing is running or waiting, the thread ends) and the
        requests `transformers`' `generate` must serve (the first waiting one's kind, as a batch)."""
        with self._lock:
            self._release_ended()
            while not self._waiting and decoder.batch is None and self._hosted_until is not None and not self._hosted_until.is_set():
                self._wakeup.wait(timeout=1.0)  # hosted: the episodes are reacting; wait for their next turns
                self._release_ended()
            if not self._waiting and decoder.batch is None:
                self._worker, self._hosted_until = None, None
                if not self.reuse_cache:
                    self.prefix_cache.clear()
                return None, []
            fallback = [r for r in self._waiting if isinstance(r, HFGenerateRequest)]
            if fallback:
                fallback = [r for r in fallback if r.same_batch_as(fallback[0])][: decoder.max_rows]
                self._waiting = [r for r in self._waiting if all(r is not f for f in fallback)]
            admitted: list[DecodeRequest] = []
            if decoder.wants_rows():
                waiting = [r for r in self._waiting if isinstance(r, DecodeRequest)]
                admitted = waiting[: decoder.free_rows]
                self._waiting = [r for r in self._waiting if all(r is not a for a in admitted)]
                if admitted and self.reuse_cache:
                    self.prefix_cache.validate(model)
            return admitted, fallback

    def _release_ended(self) -> None:
        """Drop the cached KV of the episodes that ended while this thread was decoding (lock held)."""
        for episode in self._ended:
            self.prefix_cache.release(episode)
        self._ended.clear()

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
