"""A client of one vLLM server (vLLM's OpenAI-compatible server, started by `textenv serve` or by hand).

Token ids go in and token ids come out (`/v1/completions` with a token-id prompt and ``return_token_ids``),
with each sampled token's log-probability. A request that cannot reach the server, times out or gets a
5xx answer is retried `max_retries` times with a growing pause; then, or at once for a 4xx answer (a bad
request), `VLLMServerError` says what happened. Each thread keeps its connection to the server open between
requests (HTTP keep-alive: no TCP handshake per turn); one the server closed while idle is reopened at once.
Only the standard library is used.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

JSON_HEADERS = {"content-type": "application/json"}

# vLLM's finish reasons, in textenv's words (`textenv.engine.stopping`).
FINISH_EOS, FINISH_STOP, FINISH_LENGTH = "eos", "stop", "length"


class VLLMServerError(RuntimeError):
    """A vLLM server could not serve a request (down, hung, restarting, or it refused the request)."""


@dataclass
class ServedTurn:
    """What a server generated for one request.

    Attributes:
        token_ids (`list[int]`): the sampled ids, up to and including a stop string's last token or EOS.
        logprobs (`list[float]`): the log-probability of each sampled id under the server's model.
        finish_reason (`str`): `"eos"`, `"stop"` (a stop string) or `"length"`.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class VLLMServerClient:
    """Talks to the vLLM server at `url`.

    Args:
        url (`str`): the server's address, e.g. `"http://127.0.0.1:8000"`.
        request_timeout (`float`, defaults to 300): seconds one request may take before it is retried.
        max_retries (`int`, defaults to 2): retries of a request that failed for a reason a retry can cure
            (connection refused or reset, timeout, 5xx); pauses of `retry_pause * 2**attempt` seconds.
        retry_pause (`float`, defaults to 1.0): the first pause between tries, in seconds.
    """

    def __init__(self, url: str, request_timeout: float = 300.0, max_retries: int = 2, retry_pause: float = 1.0):
        parsed = urlparse(url if "://" in url else f"http://{url}")
        if parsed.scheme not in ("http", "https") or not parsed.hostname or any(c.isspace() for c in url.strip()):
            raise ValueError(f"vllm_server_url must look like 'http://HOST:PORT', got {url!r}.")
        self.url = f"{parsed.scheme}://{parsed.netloc}"
        self.request_timeout = request_timeout
        self.max_retries = max_retries
        self.retry_pause = retry_pause
        self._model: str | None = None
        self._local = threading.local()  # this thread's open connection (`_connection`)
        self._open: set[http.client.HTTPConnection] = set()  # every thread's, for `close`
        self._open_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"VLLMServerClient({self.url!r})"

    @property
    def is_local(self) -> bool:
        """Whether the server runs on this machine (it can then read weights from a local folder)."""
        return urlparse(self.url).hostname in ("127.0.0.1", "localhost", "::1", socket.gethostname())

    # ------------------------------------------------------------------ what the server serves
    def healthy(self, timeout: float = 2.0) -> bool:
        """Whether `/health` answers 200 now (no retries)."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout) as answer:
                return answer.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def served_model(self) -> dict[str, Any]:
        """The served model's entry of `/v1/models` (`id`, `root`, `max_model_len`)."""
        models = self.request("GET", "/v1/models")["data"]
        if not models:
            raise VLLMServerError(f"The vLLM server at {self.url} serves no model.")
        self._model = models[0]["id"]
        return models[0]

    @property
    def model(self) -> str:
        if self._model is None:
            self.served_model()
        return self._model

    def tokenize(self, text: str) -> list[int]:
        """The server's token ids of `text` (no special tokens added)."""
        return self.request("POST", "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False})["tokens"]

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """The log-probability of each token of `token_ids` after the ones before it (one fewer than the ids)."""
        body = {"model": self.model, "prompt": token_ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
        entries = self.request("POST", "/v1/completions", body)["choices"][0]["prompt_logprobs"][1:]
        return [float(entry[str(token)]["logprob"]) for entry, token in zip(entries, token_ids[1:])]

    # ------------------------------------------------------------------ generation
    def complete(self, prompt_ids: list[int], sampling: dict[str, Any]) -> ServedTurn:
        """Generate from `prompt_ids` with vLLM sampling parameters `sampling` (`max_tokens`, `temperature`,
        `stop`, `seed`, ...): the new token ids with their log-probabilities."""
        body = {
            "model": self.model, "prompt": prompt_ids, "logprobs": 0, "return_token_ids": True,
            "skip_special_tokens": False, "include_stop_str_in_output": True, **sampling,
        }
        choice = self.request("POST", "/v1/completions", body)["choices"][0]
        token_ids = [int(token) for token in choice["token_ids"]]
        logprobs = [float(value) if value is not None else math.nan for value in choice["logprobs"]["token_logprobs"]]
        return ServedTurn(token_ids, logprobs, _finish_reason(choice))

    # ------------------------------------------------------------------ weights and cache
    def collective_rpc(self, method: str, kwargs: dict[str, str] | None = None, timeout: float | None = None) -> list:
        """Call `method` on every worker of the server (needs `VLLM_SERVER_DEV_MODE=1` on the server)."""
        answer = self.request("POST", "/collective_rpc", {"method": method, "kwargs": kwargs or {}}, timeout=timeout)
        return (answer or {}).get("results", [])

    def reset_prefix_cache(self) -> None:
        """Drop the server's cached prefixes (their KV was computed with the weights before a sync)."""
        self.request("POST", "/reset_prefix_cache", {})

    # ------------------------------------------------------------------ transport
    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> Any:
        """One JSON request, retried as described in the class docstring; the decoded answer (or `None`)."""
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(self.max_retries + 1):
            try:
                status, reason, raw = self._exchange(method, path, data, timeout or self.request_timeout)
            except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out, a broken answer
                failure = f"could not be reached ({error or type(error).__name__})"
            else:
                if status < 400:
                    return json.loads(raw) if raw else None
                detail = _error_detail(raw, reason)
                if status < 500:
                    raise VLLMServerError(f"The vLLM server at {self.url} refused {method} {path} ({status}): {detail}")
                failure = f"answered {status}: {detail}"
            if attempt < self.max_retries:
                pause = self.retry_pause * 2**attempt
                logger.warning("vLLM server %s %s for %s %s; retry %d/%d in %.1f s.", self.url, failure, method, path, attempt + 1, self.max_retries, pause)
                time.sleep(pause)
        raise VLLMServerError(f"The vLLM server at {self.url} {failure} for {method} {path}, after {self.max_retries} retries.")

    def close(self) -> None:
        """Close the connections kept open (a later request opens a new one)."""
        with self._open_lock:
            connections, self._open = self._open, set()
        for connection in connections:
            connection.close()

    def _exchange(self, method: str, path: str, data: bytes | None, timeout: float) -> tuple[int, str, bytes]:
        """Send one request on this thread's connection: `(status, reason, body)`. A kept-alive connection the
        server closed while it was idle fails on its next request; that request is sent again on a new one."""
        for _ in range(2):  # the kept-alive connection, then (only if that one was stale) a new one
            connection, was_open = self._connection()
            try:
                connection.timeout = timeout
                if connection.sock is not None:
                    connection.sock.settimeout(timeout)
                connection.request(method, path, body=data, headers=JSON_HEADERS)
                answer = connection.getresponse()
                raw = answer.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._drop(connection)
                if not was_open:
                    raise
                continue
            except BaseException:
                self._drop(connection)
                raise
            if answer.will_close:
                self._drop(connection)
            return answer.status, answer.reason, raw
        raise AssertionError("unreachable")

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection (a new one if it has none), and whether it was open already."""
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            return connection, connection.sock is not None
        parsed = urlparse(self.url)
        kind = http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
        connection = kind(parsed.hostname, parsed.port, timeout=self.request_timeout)
        self._local.connection = connection
        with self._open_lock:
            self._open.add(connection)
        return connection, False

    def _drop(self, connection: http.client.HTTPConnection) -> None:
        connection.close()
        if getattr(self._local, "connection", None) is connection:
            self._local.connection = None
        with self._open_lock:
            self._open.discard(connection)


def _finish_reason(choice: dict) -> str:
    return finish_reason(choice.get("finish_reason"), choice.get("stop_reason"))


def finish_reason(vllm_finish_reason: str | None, stop_reason) -> str:
    """textenv's finish reason for vLLM's: a token budget, a stop string (`stop_reason` is it), or EOS."""
    if vllm_finish_reason == "length":
        return FINISH_LENGTH
    return FINISH_STOP if isinstance(stop_reason, str) else FINISH_EOS


def _error_detail(raw: bytes, reason: str) -> str:
    """The message of an error answer's JSON body (vLLM's `error.message` or FastAPI's `detail`), else `reason`."""
    try:
        payload = json.loads(raw or b"{}")
    except ValueError:
        return reason
    if not isinstance(payload, dict):
        return str(payload)
    message = payload.get("error", payload.get("detail", payload))
    return message.get("message", str(message)) if isinstance(message, dict) else str(message)
