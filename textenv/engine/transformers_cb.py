"""`TransformersEngine`: the engine interface on transformers' continuous batching (paged attention, block
sharing across requests, its own scheduler thread), `engine="transformers"` / `--engine transformers`.

What it keeps of textenv's guarantees, and how:

- exact ids: every turn is a request for the episode's exact ids so far (`add_request(input_ids)`), and the
  ids it returns are the ids transformers sampled; nothing is re-tokenised;
- prefix reuse: transformers shares complete KV blocks by content (`allow_block_sharing`), so an episode's next
  turn and the rows of a GRPO group reuse the blocks of a prefix computed before, while the manager runs (one
  call of the front end: `run_hosted` or `generate_batch`);
- stop strings: a turn with stop strings streams its tokens; the first token that completes a stop string ends
  it (the request is cancelled) and the turn keeps exactly the ids up to that token; end ids are the manager's;
- sampling settings: greedy or sampled with temperature / top-k / top-p, as `generate` reads them; one setting
  at a time (a manager is built per setting);
- log-probs: every turn's `Completion.logprobs`, from the distribution transformers sampled from (after
  temperature / top-k / top-p);
- weight updates: the manager is built for the weights it started with; a call after the weights changed (a
  training step) starts a new one, so no block computed with older weights is reused.

What it does not keep, said where it matters: per-episode random streams (transformers samples from torch's
global generator on its own thread, so a seeded sampled run does not repeat turn for turn; greedy runs do),
`min_new_tokens` and every setting `generate` alone implements (refused with the setting's name), mixed-precision
autocast (load the model in the dtype to decode in), and rollouts that overlap training (`supports_overlap`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Hashable, Iterable, Sequence

import torch

from textenv.asyncio_bridge import run_sync
from textenv.engine.interface import DEFAULT_GENERATION_BATCH_SIZE, Completion
from textenv.engine.prefix_cache import parameters_fingerprint
from textenv.engine.sampling import DEFAULT_MAX_NEW_TOKENS, SamplingSettings
from textenv.engine.stopping import FINISH_EOS, FINISH_LENGTH, StopChecker
from textenv.engine.unwrapping import decoding_model, model_device
from textenv.padding import ensure_pad_token

logger = logging.getLogger(__name__)

# transformers shares cached KV by whole pages: a smaller page than its default 256 tokens lets an episode's next
# turn and a GRPO group's rows reuse more of their prefix.
CACHE_PAGE_TOKENS = 32
CPU_ROW_TOKENS = 2048
CPU_BATCH_TOKENS = 2048  # tokens per forward on a CPU (longer prefills are chunked)
PATH_NAME = "transformers continuous batching"
NOT_KEPT_SEEDS = (
    "transformers' continuous batching samples from torch's global generator on its own thread: a seeded run's "
    "sampled turns do not repeat turn for turn (greedy turns do; textenv's engine and vLLM repeat sampled ones)"
)
USE_TEXTENV = "pass engine='textenv' (--engine textenv)"
ENGINE_FIX = USE_TEXTENV + ", which implements it"


@dataclass(frozen=True)
class TransformersPath:
    """What decodes the turns on the transformers backend (the counterpart of `DecodingPath`)."""

    attention: str
    fast: bool = True
    reason: str = ""

    def __str__(self) -> str:
        return f"{PATH_NAME} ({self.attention} attention)"


@dataclass
class _Turn:
    """One request in flight: its stop rules, how many of its ids were checked, and whom to tell."""

    checker: StopChecker
    done: Callable[[Any], None]
    checked: int = 0
    stop_ids: set[int] = field(default_factory=set)


def continuous_batching_missing() -> str | None:
    """Why transformers' continuous batching cannot serve textenv here (`None`: it can)."""
    try:
        from transformers import ContinuousBatchingConfig  # noqa: F401
        from transformers.generation.continuous_batching import ContinuousBatchingManager
    except ImportError as error:
        return f"this transformers has no continuous batching with log-probs ({error}); pip install 'transformers>=5.16'"
    if not hasattr(ContinuousBatchingManager, "cancel_request"):
        return "this transformers' continuous batching cannot cancel a request (needed for stop strings); pip install 'transformers>=5.16'"
    return None


class TransformersEngine:
    """Generates model turns with transformers' continuous batching.

    Args:
        model: a causal LM (or a value-head / PEFT / accelerate wrapper around one) whose class has
            `init_continuous_batching` (transformers' generation mixin). May be replaced between calls.
        tokenizer: its tokenizer. A missing pad token is set to EOS (with a warning).
        generation_kwargs (`dict`, *optional*): generation settings of every turn, as for `model.generate`;
            checked here, so that a setting this backend cannot keep is refused before any episode.
        batch_size (`int`, defaults to 32): the most requests decoded in one step (on a CPU also the paged
            cache's rows, `_cache_size`; on a GPU transformers sizes the cache and the forwards itself).
        continuous_batching_config (`dict`, *optional*): more `ContinuousBatchingConfig` fields (for example
            `num_blocks`, `use_cuda_graph`); `return_logprobs` is always on.

    Raises:
        ValueError: transformers has no usable continuous batching, the model cannot be served by it, or a
            generation setting cannot be kept (the message names it and the option that fixes it).
    """

    supports_overlap = False  # a manager serves one version of the weights from start to stop

    def __init__(self, model, tokenizer, generation_kwargs: dict | None = None, batch_size: int = DEFAULT_GENERATION_BATCH_SIZE,
                 continuous_batching_config: dict | None = None):
        missing = continuous_batching_missing()
        if missing:
            raise ValueError(f"engine='transformers' is unavailable: {missing}; or {USE_TEXTENV}.")
        if not hasattr(decoding_model(model), "init_continuous_batching"):
            raise ValueError(f"engine='transformers': {type(decoding_model(model)).__name__} has no init_continuous_batching (not a transformers "
                             f"generation model); {USE_TEXTENV}.")
        _check_attention(decoding_model(model))
        self.model = model
        self.tokenizer = tokenizer
        self.generation_kwargs = generation_kwargs if generation_kwargs is not None else {}
        self.batch_size = batch_size
        self.continuous_batching_config = dict(continuous_batching_config or {})
        self.policy_version: int | None = None
        ensure_pad_token(tokenizer)
        self._lock = threading.Lock()
        self._manager = None
        self._manager_key: tuple | None = None
        self._turns: dict[str, _Turn] = {}
        self._request_ids = itertools.count()
        self._stop_checkers: dict[tuple, StopChecker] = {}
        self._warned: set[str] = set()
        self.settings(None)  # refuse a setting this backend cannot keep now, not at the first turn

    @property
    def decoding_path(self) -> TransformersPath:
        config = getattr(decoding_model(self.model), "config", None)
        return TransformersPath(attention=str(getattr(config, "_attn_implementation", None) or "default"))

    @property
    def fast_path(self) -> bool:
        return True

    # ------------------------------------------------------------------------------ the interface
    async def generate(self, context_ids: torch.Tensor, stop_strings: Iterable[str] = (), generation_kwargs: dict | None = None, *,
                       episode: Hashable | None = None) -> Completion:
        """One turn from `context_ids` (see `textenv.engine.interface.Engine.generate`). `episode` is not needed:
        transformers shares cached blocks by their content."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def done(result) -> None:
            try:
                loop.call_soon_threadsafe(_resolve, future, result)
            except RuntimeError:  # the episode's event loop has closed (its run was interrupted)
                pass

        seeded = getattr(episode, "random_stream", None) is not None
        self._submit(context_ids, tuple(stop_strings), generation_kwargs, done, stop_at_eos=True, seeded=seeded)
        return self._completion(await future, context_ids.device)

    def generate_batch(self, contexts: Sequence[torch.Tensor], stop_strings: Iterable[str] = (), generation_kwargs: dict | None = None,
                       batch_size: int | None = None, stop_at_eos: bool = True) -> list[Completion]:
        """One turn for every context, waiting for all of them; the manager stops at the end (its paged attention
        is the model's only while it runs)."""
        results: list[Any] = [None] * len(contexts)
        finished = threading.Semaphore(0)

        def collector(index: int) -> Callable[[Any], None]:
            def done(result) -> None:
                results[index] = result
                finished.release()

            return done

        try:
            for index, context in enumerate(contexts):
                self._submit(context, tuple(stop_strings), generation_kwargs, collector(index), stop_at_eos)
            for _ in contexts:
                finished.acquire()
        finally:
            self.stop()
        return [self._completion(result, context.device) for result, context in zip(results, contexts)]

    def end_episode(self, episode: Hashable) -> None:
        """Nothing is kept per episode (blocks are shared by content, freed by transformers' own policy)."""

    def run_hosted(self, coroutine: Awaitable) -> Any:
        """Run `coroutine` (episodes calling `generate`) and stop the manager when it ends."""
        try:
            return run_sync(coroutine)
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop the manager (the model gets its own attention back); turns still in flight fail."""
        with self._lock:
            manager, self._manager, self._manager_key = self._manager, None, None
            stranded, self._turns = list(self._turns.values()), {}
        if manager is not None:
            manager.destroy()
        for turn in stranded:
            turn.done(RuntimeError("The transformers engine was stopped while this turn was being generated."))

    close = stop

    def settings(self, generation_kwargs: dict | None) -> SamplingSettings:
        """The sampling settings of a turn with `generation_kwargs` over the engine's; raises `ValueError` for a
        setting this backend cannot keep."""
        kwargs = {**self.generation_kwargs, **(generation_kwargs or {})}
        generation_config = getattr(decoding_model(self.model), "generation_config", None)
        settings = SamplingSettings.from_kwargs(generation_config, kwargs, DEFAULT_MAX_NEW_TOKENS)
        if settings is None:
            setting = SamplingSettings.unsupported_setting(generation_config, kwargs)
            raise ValueError(f"engine='transformers' cannot keep the generation setting {setting}: {ENGINE_FIX}.")
        if settings.min_new_tokens:
            raise ValueError(f"engine='transformers' cannot keep min_new_tokens={settings.min_new_tokens} (its continuous batching drops that "
                             f"processor): {ENGINE_FIX}.")
        return settings

    # ------------------------------------------------------------------------------ serving
    def _submit(self, context: torch.Tensor, stop_strings: tuple, generation_kwargs: dict | None, done: Callable, stop_at_eos: bool,
                seeded: bool = False) -> None:
        settings = self.settings(generation_kwargs)
        if seeded and settings.do_sample:
            self._warn_once(NOT_KEPT_SEEDS)
        stop_ids = set(settings.eos_token_ids)
        if stop_at_eos and self.tokenizer.eos_token_id is not None:
            stop_ids.add(int(self.tokenizer.eos_token_id))
        turn = _Turn(self._stop_checker(stop_strings, frozenset(stop_ids)), done, stop_ids=stop_ids)
        with self._lock:
            manager = self._manager_for(settings)
            request_id = f"textenv-{next(self._request_ids)}"
            self._turns[request_id] = turn
        accepted = manager.add_request(
            context.detach().to("cpu", torch.long).tolist(), request_id=request_id, max_new_tokens=settings.max_new_tokens,
            streaming=bool(turn.checker.stop_strings), eos_token_id=sorted(stop_ids) or -1,
        )
        if accepted is None:
            self._finish(request_id, RuntimeError("transformers' continuous batching refused the request (its manager is stopping)."))

    def _manager_for(self, settings: SamplingSettings):
        """The running manager for `settings` and the current weights, started if needed (lock held)."""
        model = decoding_model(self.model)
        key = (settings.do_sample, settings.temperature, settings.top_k, settings.top_p, parameters_fingerprint(model))
        if self._manager is not None and key == self._manager_key:
            return self._manager
        if self._turns:
            changed = "weights" if key[:4] == self._manager_key[:4] else "sampling settings"
            raise ValueError(f"engine='transformers' serves one version of the weights and one sampling setting at a time, and the {changed} "
                             f"changed while turns were in flight: keep them fixed during a run, or {ENGINE_FIX}.")
        if self._manager is not None:
            self._manager.destroy()
        self._manager, self._manager_key = self._start_manager(model, settings), key
        threading.Thread(target=self._collect, args=(self._manager,), name="textenv-transformers-results", daemon=True).start()
        return self._manager

    def _start_manager(self, model, settings: SamplingSettings):
        from transformers import ContinuousBatchingConfig, GenerationConfig

        sampling = dict(temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p) if settings.do_sample else {}
        generation_config = GenerationConfig(do_sample=settings.do_sample, max_new_tokens=settings.max_new_tokens, eos_token_id=-1,
                                             pad_token_id=self.tokenizer.pad_token_id, **sampling)
        options = {"max_requests_per_batch": self.batch_size, **_cache_size(model, self.batch_size), **self.continuous_batching_config, "return_logprobs": True}
        manager = model.init_continuous_batching(generation_config=generation_config, continuous_batching_config=ContinuousBatchingConfig(**options))
        with torch.inference_mode():  # the manager's thread decodes in the caller's inference mode
            manager.start()
        return manager

    def _collect(self, manager) -> None:
        """The results thread: every output transformers delivers, until its manager is replaced or stopped."""
        while self._manager is manager or not manager.output_router.output_queue.empty():
            output = manager.get_result(timeout=0.1)
            if output is not None:
                self._deliver(manager, output)
            elif not manager.is_running():
                return

    def _deliver(self, manager, output) -> None:
        turn = self._turns.get(output.request_id)
        if turn is None:  # a turn already ended at its stop string, or failed
            return
        if output.error:
            self._finish(output.request_id, RuntimeError(f"transformers' continuous batching failed this turn: {output.error}"))
            return
        ids, reason = _cut_at_stop(turn, list(output.generated_tokens))
        if reason is not None and not output.is_finished():
            manager.cancel_request(output.request_id)
        elif reason is None and output.is_finished():
            reason = FINISH_EOS if ids and ids[-1] in turn.stop_ids else FINISH_LENGTH
        if reason is not None:
            self._finish(output.request_id, (ids, reason, list(output.logprobs)[: len(ids)]))

    def _finish(self, request_id: str, result) -> None:
        with self._lock:
            turn = self._turns.pop(request_id, None)
        if turn is not None:
            turn.done(result)

    def _stop_checker(self, stop_strings: tuple, stop_ids: frozenset) -> StopChecker:
        key = (stop_strings, stop_ids, id(self.tokenizer))
        if key not in self._stop_checkers:
            self._stop_checkers[key] = StopChecker(self.tokenizer, list(stop_strings), set(stop_ids))
        return self._stop_checkers[key]

    def _completion(self, result, device: torch.device) -> Completion:
        if isinstance(result, BaseException):
            raise result
        ids, reason, logprobs = result
        token_ids = torch.tensor(ids, dtype=torch.long, device=device)
        text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
        logprob_tensor = torch.tensor(logprobs, dtype=torch.float32) if len(logprobs) == len(ids) else None
        return Completion(token_ids=token_ids, text=text, finish_reason=reason, logprobs=logprob_tensor, policy_version=self.policy_version)

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            logger.warning(message)


def _check_attention(model) -> None:
    """Refuse a model whose attention implementation transformers' continuous batching cannot page (it would fail
    at the first turn): it takes eager, sdpa and the flash implementations."""
    implementation = str(getattr(getattr(model, "config", None), "_attn_implementation", None) or "sdpa")
    if implementation not in ("eager", "sdpa", "paged|eager", "paged|sdpa") and "flash" not in implementation:
        raise ValueError(f"engine='transformers' cannot page the attention implementation {implementation!r}: load the model with "
                         f"attn_implementation='sdpa' (or a flash implementation), or {USE_TEXTENV}.")


def _cache_size(model, batch_size: int) -> dict[str, int | float]:
    """On a CPU, the paged cache's size: room for `batch_size` rows of `CPU_ROW_TOKENS` tokens, or what a quarter of
    the memory free now holds if that is less, and forwards of `CPU_BATCH_TOKENS` tokens. transformers' own default
    there takes 60% of the machine's total memory less this process's, whatever other processes use (an
    out-of-memory kill on a shared machine, and seconds spent allocating it at every start). On a GPU transformers'
    default stands (most of the free GPU memory, released when the manager stops)."""
    if model_device(model).type != "cpu":
        return {}
    import psutil

    memory = psutil.virtual_memory()
    config = model.config.get_text_config()
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    token_bytes = 2 * config.num_hidden_layers * heads * head_dim * next(model.parameters()).element_size()  # keys and values
    tokens = min(batch_size * CPU_ROW_TOKENS, memory.available // 4 // token_bytes)
    size_field = "page_size" if "page_size" in _config_fields() else "block_size"
    return {"num_blocks": max(1, tokens // CACHE_PAGE_TOKENS), size_field: CACHE_PAGE_TOKENS, "max_batch_tokens": CPU_BATCH_TOKENS,
            "max_memory_percent": round(0.5 * memory.available / memory.total, 3)}


def _config_fields() -> set[str]:
    import dataclasses

    from transformers import ContinuousBatchingConfig

    return {item.name for item in dataclasses.fields(ContinuousBatchingConfig)}


def _cut_at_stop(turn: _Turn, ids: list[int]) -> tuple[list[int], str | None]:
    """`ids` cut after the first token that completes a stop string (checked token by token from where the last
    output left off), and the reason; the ids unchanged and `None` when no stop string is complete."""
    if not turn.checker.stop_strings:
        return ids, None
    for length in range(turn.checked + 1, len(ids) + 1):
        reason = turn.checker.finished([ids[:length]])[0]
        if reason is not None:
            return ids[:length], reason
    turn.checked = len(ids)
    return ids, None


def _resolve(future: asyncio.Future, result) -> None:
    if not future.done():  # the episode may have been cancelled while its turn was generated
        future.set_result(result)
