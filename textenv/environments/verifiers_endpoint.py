"""An OpenAI-compatible chat-completions endpoint whose every reply is a turn of textenv's episode driver.

verifiers v1 harnesses reach the model over HTTP (their chat program posts to verifiers' interception
server, which forwards the request to the endpoint of the rollout's `ModelContext`). This endpoint is that
model: each episode registers under its own key and gets its own base URL
(``http://127.0.0.1:PORT/episodes/KEY/v1``), so a request names its episode by its path and waits for the
reply textenv generates from the episode's exact token ids. Streamed (server-sent events) and plain JSON
answers are both served, as OpenAI's API does; ``GET .../v1/models`` lists the model.

aiohttp comes with verifiers 0.4 (its interception server uses it); `textenv` never imports this module
otherwise.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Protocol

from aiohttp import web

HOST = "127.0.0.1"


@dataclass
class ChatReply:
    """One model turn as the endpoint answers it (OpenAI's chat-completion message and usage)."""

    content: str
    tool_calls: List[Dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def message(self) -> Dict[str, Any]:
        message: Dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message

    def usage(self) -> Dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


class ContextOverflow(Exception):
    """The episode cannot take another turn (it reached the scheduler's `max_length`): answered as OpenAI's
    ``context_length_exceeded`` error, which verifiers' chat program takes as the end of the conversation."""


class EpisodeModel(Protocol):
    """What the endpoint needs of an episode: the reply to one chat-completions request body."""

    async def answer(self, body: Dict[str, Any]) -> ChatReply: ...


class EpisodeEndpoint:
    """The HTTP server (started with `start`, in the event loop the episodes run in) and its registered episodes."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.episodes: Dict[str, EpisodeModel] = {}
        self.base_url = ""
        self._runner: Optional[web.AppRunner] = None

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/episodes/{key}/v1/chat/completions", self._chat_completions)
        app.router.add_get("/episodes/{key}/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # aiohttp has no public accessor for port 0's choice
        self.base_url = f"http://{HOST}:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def register(self, episode: EpisodeModel) -> str:
        """Serve `episode`; returns its base URL (what the rollout's client config points to)."""
        key = uuid.uuid4().hex
        self.episodes[key] = episode
        return f"{self.base_url}/episodes/{key}/v1"

    def unregister(self, url: str) -> None:
        self.episodes.pop(url.rstrip("/").split("/")[-2], None)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "textenv"}]})

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        episode = self.episodes.get(request.match_info["key"])
        if episode is None:
            return _error(404, "no such episode: it has ended (or never began) on this textenv endpoint", "not_found")
        body = await request.json()
        try:
            reply = await episode.answer(body)
        except ContextOverflow as error:
            return _error(400, f"This model's maximum context length was reached: {error}", "context_length_exceeded")
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:16]}"
        model = body.get("model") or self.model_name
        if not body.get("stream"):
            return web.json_response({
                "id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "message": reply.message(), "finish_reason": reply.finish_reason, "logprobs": None}],
                "usage": reply.usage(),
            })
        return await _stream(request, reply, completion_id, model, bool((body.get("stream_options") or {}).get("include_usage")))


async def _stream(request: web.Request, reply: ChatReply, completion_id: str, model: str, include_usage: bool) -> web.StreamResponse:
    """The reply as OpenAI's chunk stream: the role, the text, the tool calls (with their `index`), the finish
    reason, the usage when asked for, then ``[DONE]``."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    created = int(time.time())

    async def send(delta: Optional[Dict[str, Any]], finish_reason: Optional[str] = None, usage: Optional[dict] = None) -> None:
        chunk: Dict[str, Any] = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                                 "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
        if usage is not None:
            chunk["usage"] = usage
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

    await send({"role": "assistant", "content": ""})
    if reply.content:
        await send({"content": reply.content})
    if reply.tool_calls:
        await send({"tool_calls": [{"index": index, **call} for index, call in enumerate(reply.tool_calls)]})
    await send({}, finish_reason=reply.finish_reason)
    if include_usage:
        await send(None, usage=reply.usage())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _error(status: int, message: str, code: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "code": code}}, status=status)
