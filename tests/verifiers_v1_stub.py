"""The scripted policy of the verifiers v1 equality tests, served two ways: as an OpenAI-compatible streamed
chat-completions endpoint (an aiohttp server, what verifiers' own `Env.run_episode` talks to through its
interception server and chat harness), and as textenv's `ScriptedPolicy` (the same replies as generated text,
calls in the template's ``<tool_call>`` form).

A script is ``script(question, tool_results) -> (content, call)``: the episode's last user message and the
tool results it has had so far; `call` is ``(name, arguments)`` or `None`."""

from __future__ import annotations

import json
import re
import time
from typing import Callable, List, Optional, Tuple

Call = Optional[Tuple[str, dict]]
Script = Callable[[str, List[str]], Tuple[str, Call]]
CALL = '<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def rendered(content: str, call: Call) -> str:
    return content if call is None else content + CALL.format(name=call[0], arguments=json.dumps(call[1]))


def textenv_policy(tokenizer, script: Script):
    """The script as textenv's `ScriptedPolicy`, reading the question and the tool results from the context."""
    from textenv.gym import ScriptedPolicy

    def reply(context: str) -> str:
        question = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", context, re.S)[-1]
        results = [result.strip() for result in re.findall(r"<tool_response>\n?(.*?)\n?</tool_response>", context, re.S)]
        return rendered(*script(question, results))

    return ScriptedPolicy(tokenizer, reply)


async def start_stub(script: Script):
    """An aiohttp server answering chat completions with `script` (streamed when asked); returns (runner, base URL)."""
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        messages = body["messages"]
        question = [message["content"] for message in messages if message["role"] == "user"][-1]
        results = [message["content"] for message in messages if message["role"] == "tool"]
        content, call = script(question, results)
        calls = [] if call is None else [{"id": f"call{len(results):05d}", "type": "function",
                                          "function": {"name": call[0], "arguments": json.dumps(call[1])}}]
        finish = "tool_calls" if calls else "stop"
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(delta, finish_reason=None, usage=None):
            chunk = {"id": "stub", "object": "chat.completion.chunk", "created": int(time.time()), "model": body["model"],
                     "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
            if usage is not None:
                chunk["usage"] = usage
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

        await send({"role": "assistant", "content": ""})
        if content:
            await send({"content": content})
        if calls:
            await send({"tool_calls": [{"index": index, **c} for index, c in enumerate(calls)]})
        await send({}, finish_reason=finish)
        await send(None, usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"


def comparable(messages: list, reward: float, rewards: dict, metrics: dict) -> tuple:
    """An episode as JSON text that both sides can produce: roles, texts, tool calls (name and parsed
    arguments; ids differ by design), the tool results, and verifiers' scores."""
    normal = []
    for message in messages:
        fields = message if isinstance(message, dict) else message.model_dump(exclude_none=True)
        entry = {"role": fields["role"], "content": fields.get("content") or ""}
        calls = fields.get("tool_calls") or []
        if calls:
            entry["tool_calls"] = [_call(call) for call in calls]
        normal.append(entry)
    return json.dumps([normal, reward, rewards, metrics], sort_keys=True)


def _call(call) -> list:
    function = call.get("function", call)
    arguments = function.get("arguments")
    return [function.get("name"), json.loads(arguments) if isinstance(arguments, str) else arguments]


def verifiers_own(env, tasks, script: Script) -> List[str]:
    """verifiers' own episodes of `tasks` against the stub, as `comparable`s."""
    import asyncio

    from verifiers.v1.clients import EvalClientConfig, ModelContext

    async def run() -> list:
        runner, url = await start_stub(script)
        try:
            context = ModelContext(model="stub", client=EvalClientConfig(base_url=url, api_key_var="STUB_KEY"))
            async with env.serving():
                episodes = [await env.run_episode(task, context) for task in tasks]
        finally:
            await runner.cleanup()
        out = []
        for episode in episodes:
            trace = episode.traces[0]
            out.append(comparable(trace.messages, trace.reward, {k: v.score for k, v in trace.rewards.items()}, dict(trace.metrics)))
        return out

    return asyncio.run(run())
