"""`VLLMEngine`: the engine entry on vLLM. Episodes ask for turns exactly as they ask the in-process
`GenerationEngine` (``await engine.generate(context_ids, stop_strings, generation_kwargs, episode=key)``)
and get the same `Completion`: the ids the server sampled (never a re-tokenisation), their text, the finish
reason, and the server's log-probability of each id.

- Every request carries its own sampling settings (transformers' names, mapped to vLLM's) and a seed drawn
  from the episode's random stream, so a seeded run's sampled episodes repeat.
- An episode keeps the server it started on (its earlier turns stay in that server's prefix cache); new
  episodes go to the server with the fewest running episodes.
- Before serving a call whose model weights changed (a PPO step, `load_state_dict`), the weights are sent
  to every server (`WeightSync`) and the servers' prefix caches are dropped.
- At first use the servers are checked: same tokenizer as the trainer's, and a model whose log-probabilities
  on a probe text match the trainer's model (after the first sync when syncing is on).
- A server that fails a request after its retries fails that episode's turn only (the driver records it).
- Every turn passes a `ServingGate`: it is served whole by one version of the weights, and its `Completion`
  says which (`policy_version`). While rollouts overlap training, the loop turns `auto_sync` off and calls
  `publish_weights(version)` after each step: pause new turns, wait for those in flight, sync, resume.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Hashable, Iterable, Sequence

import torch

from textenv.asyncio_bridge import run_sync
from textenv.engine.interface import DEFAULT_GENERATION_BATCH_SIZE, Completion
from textenv.engine.prefix_cache import parameters_fingerprint
from textenv.engine.sampling import DEFAULT_MAX_NEW_TOKENS, SamplingSettings
from textenv.engine.unwrapping import decoding_model, unwrap_model
from textenv.padding import ensure_pad_token
from textenv.vllm.checks import check_served_model
from textenv.vllm.client import VLLMServerClient
from textenv.vllm.gate import ServingGate
from textenv.vllm.weights import WeightSync

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VLLMPath:
    """What decodes the turns on the vLLM backend (the counterpart of `DecodingPath`)."""

    urls: tuple[str, ...]
    mode: str = "server"
    fast: bool = True
    reason: str = ""

    def __str__(self) -> str:
        return f"vLLM {self.mode} ({', '.join(self.urls)})"


class VLLMEngine:
    """Generates model turns on one or more vLLM servers.

    Args:
        model: the policy (a causal LM, a value-head wrapper, PEFT, accelerate-wrapped); its weights are sent
            to the servers whenever they changed. May be replaced between calls (`engine.model = ...`).
        tokenizer: its tokenizer (must be the servers').
        clients (`list[VLLMServerClient]`): the servers, or anything with the same methods (colocated vLLM).
        generation_kwargs (`dict`, *optional*): generation settings of every turn, transformers' names.
        batch_size (`int`, defaults to 32): most requests in flight (`batch_size` x servers in all); may be changed
            between calls (the front ends set their own before each run).
        sync_weights (`bool`, defaults to `True`): send the weights when they change; `False` trusts the
            servers to serve the policy (then a server whose model differs from `model` is refused).
        weights_dir (`str`, *optional*): the folder the weights are written to (see `WeightSync`).
        check_model (`bool`, defaults to `True`): compare the servers' model and tokenizer with the trainer's
            at first use.
    """

    def __init__(self, model, tokenizer, clients: Sequence[VLLMServerClient], generation_kwargs: dict | None = None,
                 batch_size: int = DEFAULT_GENERATION_BATCH_SIZE, sync_weights: bool = True, weights_dir: str | None = None, check_model: bool = True):
        if not clients:
            raise ValueError("The vLLM backend needs at least one server: pass vllm_server_url='http://HOST:PORT'.")
        self.model = model
        self.tokenizer = tokenizer
        self.clients = list(clients)
        self.generation_kwargs = generation_kwargs if generation_kwargs is not None else {}
        self.check_model = check_model
        self.weight_sync = WeightSync(self.clients, weights_dir) if sync_weights else None
        ensure_pad_token(tokenizer)
        self.batch_size = batch_size
        self._pools: dict[int, ThreadPoolExecutor] = {}  # request threads, by their number (`_pool`)
        self._closed = False
        weakref.finalize(self, _shutdown_pools, self._pools)
        self._server_of: dict[Hashable, int] = {}
        self._running = [0] * len(self.clients)
        self._lock = threading.Lock()  # which server serves which episode
        self._sync_lock = threading.Lock()  # the weight checks and syncs (`prepare`, `sync_weights`)
        self._prepare_calls = itertools.count(1)  # numbers the calls of `prepare` and the checks they start
        self._prepared_before = 0  # every call numbered below it is served by a finished check
        self._synced_fingerprint: Any = None
        self._checked = False
        self.gate = ServingGate()
        self.auto_sync = True  # prepare() sends changed weights; off while rollouts overlap training

    @property
    def _pool(self) -> ThreadPoolExecutor:
        """The request threads for the current `batch_size`: `batch_size` x servers of them, so that a front end's
        batch size (set on the engine before each run) is how many requests it has in flight. One pool per size,
        kept until `close` (threads start as requests need them)."""
        if self._closed:
            raise RuntimeError("This VLLMEngine was closed.")
        workers = self.batch_size * len(self.clients)
        pool = self._pools.get(workers)
        if pool is None:
            pool = self._pools.setdefault(workers, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="textenv-vllm"))
        return pool

    @property
    def policy_version(self) -> int | None:
        """The version of the weights the servers hold, stamped on every `Completion`."""
        return self.gate.version

    @policy_version.setter
    def policy_version(self, version: int | None) -> None:
        self.gate.version = version

    @property
    def supports_overlap(self) -> bool:
        """Rollouts can run beside training: the servers hold their own copy of the weights."""
        return self.weight_sync is not None

    @property
    def decoding_path(self) -> VLLMPath:
        return VLLMPath(tuple(client.url for client in self.clients), getattr(self.clients[0], "mode", "server"))

    @property
    def fast_path(self) -> bool:
        return True

    @property
    def sync_seconds(self) -> list[float]:
        """Seconds each weight sync took (empty without syncing)."""
        return self.weight_sync.sync_seconds if self.weight_sync is not None else []

    # ------------------------------------------------------------------------------ requests
    async def generate(self, context_ids: torch.Tensor, stop_strings: Iterable[str] = (), generation_kwargs: dict | None = None,
                       *, episode: Hashable | None = None) -> Completion:
        """Generate one turn from `context_ids` on the episode's server (see `GenerationEngine.generate`).

        The turn's weight check (`prepare`, asked for now) and its request run one after the other in one request
        thread: one hand-over to a thread and one back per turn (each is a wake-up that waits for a core while the
        server keeps the machine busy)."""
        call = next(self._prepare_calls)
        server = self._server_for(episode)
        stream = getattr(episode, "random_stream", None)
        request = self._sampling(len(context_ids), stop_strings, generation_kwargs, stream)
        prompt = context_ids.detach().to("cpu").tolist()
        served, version = await asyncio.get_running_loop().run_in_executor(self._pool, self._prepared_turn, call, server, prompt, request)
        return self._completion(served, version, context_ids.device)

    def generate_batch(self, contexts: Sequence[torch.Tensor], stop_strings: Iterable[str] = (), generation_kwargs: dict | None = None,
                       batch_size: int | None = None, stop_at_eos: bool = True) -> list[Completion]:
        """One turn for every context, spread over the servers; waits for all (see `GenerationEngine`). A
        server always ends a turn at EOS: `stop_at_eos=False` is refused."""
        if not stop_at_eos:
            raise ValueError("The vLLM backend always stops a turn at EOS; stop_at_eos=False is served by engine='textenv' only.")
        self.prepare()
        stop_strings = tuple(stop_strings)
        futures = []
        for index, context in enumerate(contexts):
            request = self._sampling(len(context), stop_strings, generation_kwargs, None)
            futures.append(self._pool.submit(self._served_turn, index % len(self.clients), context.detach().to("cpu").tolist(), request))
        return [self._completion(*future.result(), context.device) for future, context in zip(futures, contexts)]

    def end_episode(self, episode: Hashable) -> None:
        with self._lock:
            server = self._server_of.pop(episode, None)
            if server is not None:
                self._running[server] -= 1

    def run_hosted(self, coroutine: Awaitable) -> Any:
        """Run `coroutine` (episodes generating with this engine) to completion and return its result. A
        colocated vLLM in sleep mode then releases its memory for the trainer's step."""
        self.prepare()
        try:
            return run_sync(coroutine)
        finally:
            for client in self._sleeping_clients():
                client.sleep()

    @property
    def sleeps_between_runs(self) -> bool:
        """Whether a colocated vLLM releases its memory after each run of episodes (sleep mode)."""
        return bool(self._sleeping_clients())

    def _sleeping_clients(self) -> list:
        return [client for client in self.clients if getattr(client, "sleep_mode", False)]

    # ------------------------------------------------------------------------------ weights and checks
    def prepare(self, call: int | None = None) -> None:
        """Check the servers (first call) and send the weights if they changed since the last sync.

        Every turn calls it (`call`: the number its turn drew when it asked, `next(self._prepare_calls)`; default:
        now). Calls that arrive while a check runs wait for it and are then served by one check begun after them
        all (a check that began after a call saw the weights as they were at that call, or newer), so that many
        episodes starting their turns together wait for at most two checks, not one each."""
        call = next(self._prepare_calls) if call is None else call
        with self._sync_lock:
            if call < self._prepared_before:
                return
            check = next(self._prepare_calls)  # the calls numbered below it were made before this check began
            if self.auto_sync:
                fingerprint = parameters_fingerprint(decoding_model(self.model))
                weights_dropped = any(getattr(client, "needs_weights", False) for client in self.clients)
                if self.weight_sync is not None and (fingerprint != self._synced_fingerprint or weights_dropped):
                    self.weight_sync.sync(self.model)
                self._synced_fingerprint = fingerprint
            if self.check_model and not self._checked:
                for client in self.clients:
                    check_served_model(client, unwrap_model(self.model), self.tokenizer, synced=self.weight_sync is not None)
                self._checked = True
            self._prepared_before = check

    def sync_weights(self) -> float:
        """Send the weights now, changed or not; returns the seconds it took."""
        if self.weight_sync is None:
            raise ValueError("This engine was made with sync_weights=False.")
        with self._sync_lock:
            seconds = self.weight_sync.sync(self.model)
            self._synced_fingerprint = parameters_fingerprint(decoding_model(self.model))
        return seconds

    def publish_weights(self, version: int) -> tuple[float, float]:
        """Load the policy's current weights into the servers as `version`, between turns: new turns wait,
        those in flight finish on the old weights, then the weights are sent and the prefix caches dropped.

        Returns:
            `(pause_seconds, sync_seconds)`: the wait for the turns in flight, and the sync itself.
        """
        pause_seconds = self.gate.pause()
        synced = False
        try:
            sync_seconds = self.sync_weights()
            synced = True
        finally:
            self.gate.resume(version if synced else None)
        return pause_seconds, sync_seconds

    def close(self) -> None:
        self._closed = True
        _shutdown_pools(self._pools, cancel_futures=True)
        for client in self.clients:
            if hasattr(client, "close"):
                client.close()
        if self.weight_sync is not None:
            self.weight_sync.close()

    # ------------------------------------------------------------------------------ helpers
    def _server_for(self, episode: Hashable | None) -> int:
        with self._lock:
            if episode is not None and episode in self._server_of:
                return self._server_of[episode]
            server = min(range(len(self.clients)), key=lambda index: self._running[index])
            if episode is not None:
                self._server_of[episode] = server
                self._running[server] += 1
            return server

    def _sampling(self, context_length: int, stop_strings: Iterable[str], generation_kwargs: dict | None, stream) -> dict[str, Any]:
        kwargs = {**self.generation_kwargs, **(generation_kwargs or {})}
        generation_config = getattr(unwrap_model(self.model), "generation_config", None)
        settings = SamplingSettings.from_kwargs(generation_config, kwargs, DEFAULT_MAX_NEW_TOKENS)
        if settings is None:
            setting = SamplingSettings.unsupported_setting(generation_config, kwargs)
            raise ValueError(f"The vLLM backend does not implement the generation setting {setting}; remove it from generation_kwargs.")
        return vllm_sampling(settings, tuple(stop_strings), _seed(stream) if settings.do_sample else None)

    def _prepared_turn(self, call: int, server: int, prompt: list[int], request: dict[str, Any]) -> tuple[Any, int | None]:
        """In a request thread: the weight check turn `call` asked for (`prepare`), then its request."""
        self.prepare(call)
        return self._served_turn(server, prompt, request)

    def _served_turn(self, server: int, prompt: list[int], request: dict[str, Any]) -> tuple[Any, int | None]:
        """One request to `server`, through the gate: `(the served turn, the version that served it)`."""
        with self.gate.turn() as version:
            return self.clients[server].complete(prompt, request), version

    def _completion(self, served, version: int | None, device: torch.device) -> Completion:
        token_ids = torch.tensor(served.token_ids, dtype=torch.long, device=device)
        logprobs = torch.tensor(served.logprobs, dtype=torch.float32, device=device)
        text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
        return Completion(token_ids=token_ids, text=text, finish_reason=served.finish_reason, logprobs=logprobs, policy_version=version)


def _shutdown_pools(pools: dict[int, ThreadPoolExecutor], cancel_futures: bool = False) -> None:
    for pool in list(pools.values()):
        pool.shutdown(wait=False, cancel_futures=cancel_futures)


def vllm_sampling(settings: SamplingSettings, stop_strings: tuple[str, ...], seed: int | None) -> dict[str, Any]:
    """vLLM's sampling parameters for textenv's `settings` (greedy is temperature 0; top_k 0 means all)."""
    request: dict[str, Any] = {"max_tokens": settings.max_new_tokens, "stop": list(stop_strings)}
    if settings.eos_token_ids:
        request["stop_token_ids"] = sorted(settings.eos_token_ids)
    if settings.min_new_tokens:
        request["min_tokens"] = settings.min_new_tokens
    if not settings.do_sample:
        request["temperature"] = 0.0
        return request
    request.update(temperature=settings.temperature, top_k=settings.top_k or -1, top_p=settings.top_p)
    if seed is not None:
        request["seed"] = seed
    return request


def _seed(stream) -> int:
    """A request seed: from the episode's random stream, else from torch's global generator."""
    if stream is not None:
        return int(stream.next_uniform() * (2**31 - 1))
    return int(torch.randint(0, 2**31 - 1, (1,)).item())


__all__ = ["VLLMEngine", "VLLMPath", "vllm_sampling"]
