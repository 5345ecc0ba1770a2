"""The scripted policy of the verifiers equality tests, served two ways: as an OpenAI-compatible chat
completions endpoint (an `httpx.MockTransport` behind verifiers' own `OpenAIChatCompletionsClient`), and as
textenv's `ScriptedPolicy` (the same replies as generated text, calls in the template's ``<tool_call>`` form).

A script is ``script(question, choice, turn) -> (content, call)`` where `call` is ``(name, arguments)`` or
`None`. Both sides pick `choice` the same way: the episodes of a question take choices 0, 1, ... in the order
of their first turn, and a later turn recovers its episode's choice from the episode's first reply."""

from __future__ import annotations

import json
import re
from typing import Callable, List, Optional, Tuple

import httpx

Call = Optional[Tuple[str, dict]]
Script = Callable[[str, int, int], Tuple[str, Call]]
CALL = '<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def rendered(content: str, call: Call) -> str:
    """A reply as the model's text: the content, then the call in the hermes form."""
    return content if call is None else content + CALL.format(name=call[0], arguments=json.dumps(call[1]))


class Chooser:
    """The reply of a turn, given the episode's question and its earlier replies (as text)."""

    def __init__(self, script: Script, choices: int):
        self.script = script
        self.choices = choices
        self.started: dict = {}

    def reply(self, question: str, earlier: List[str]) -> Tuple[str, Call]:
        if not earlier:
            choice = self.started.get(question, 0) % self.choices
            self.started[question] = self.started.get(question, 0) + 1
        else:
            choice = next(c for c in range(self.choices) if rendered(*self.script(question, c, 0)) == earlier[0])
        return self.script(question, choice, len(earlier))


def openai_stub_client(chooser: Chooser, is_question: Callable[[str], bool]):
    """verifiers' `OpenAIChatCompletionsClient` over an in-process endpoint that answers with `chooser`."""
    from openai import AsyncOpenAI
    from verifiers.legacy.clients.openai_chat_completions_client import OpenAIChatCompletionsClient

    def handler(request: httpx.Request) -> httpx.Response:
        messages = json.loads(request.content)["messages"]
        start = next(i for i, message in enumerate(messages) if message["role"] == "user" and is_question(message["content"]))
        earlier = [rendered(m.get("content") or "", _call_of(m)) for m in messages[start:] if m["role"] == "assistant"]
        content, call = chooser.reply(messages[start]["content"], earlier)
        message = {"role": "assistant", "content": content}
        if call is not None:
            message["tool_calls"] = [{"id": f"call{len(earlier):05d}", "type": "function",
                                      "function": {"name": call[0], "arguments": json.dumps(call[1])}}]
        body = {"id": "stub", "object": "chat.completion", "created": 0, "model": "stub",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if call else "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        return httpx.Response(200, json=body)

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return OpenAIChatCompletionsClient(AsyncOpenAI(base_url="http://stub/v1", api_key="stub", http_client=http))


def verifiers_own(env, rows, script: Script, generations: int, is_question: Callable[[str], bool]) -> list:
    """verifiers' own rollouts and scores of `rows`, `generations` each, against the stub endpoint, as `comparable`s."""
    import asyncio

    inputs = [row for row in rows for _ in range(generations)]
    client = openai_stub_client(Chooser(script, generations), is_question)
    outputs = asyncio.run(env.generate(inputs, client=client, model="stub", sampling_args={"max_tokens": 64}))["outputs"]
    return sorted(comparable([*output["prompt"], *output["completion"]], [output["reward"], output["metrics"]]) for output in outputs)


def textenv_own(env, rows, tokenizer, script: Script, generations: int, is_question: Callable[[str], bool]) -> list:
    """textenv's episodes of the same rows and script (none may fail), as `comparable`s."""
    from textenv.gym import GymScheduler

    policy = scripted_policy(tokenizer, Chooser(script, generations), is_question)
    episodes = GymScheduler(None, tokenizer, policy=policy, verifiers_env=env, loss_scale="all").run(rows, num_generations=generations)
    assert [episode.errors for episode in episodes if episode.errors] == []
    return sorted(comparable(e.messages, [e.final_reward, e.trajectory_infos[-1]["metrics"]]) for e in episodes)


def _call_of(message: dict) -> Call:
    calls = message.get("tool_calls") or []
    if not calls:
        return None
    function = calls[0]["function"]
    return function["name"], json.loads(function["arguments"])


def scripted_policy(tokenizer, chooser: Chooser, is_question: Callable[[str], bool]):
    """textenv's side: a `ScriptedPolicy` reading the question and earlier replies from the chat-template text."""
    from textenv.gym import ScriptedPolicy

    turn_pattern = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", re.S)

    def reply(context: str) -> str:
        turns = turn_pattern.findall(context)
        start = next(i for i, (role, text) in enumerate(turns) if role == "user" and is_question(text))
        earlier = [text for role, text in turns[start:] if role == "assistant"]
        return rendered(*chooser.reply(turns[start][1], earlier))

    return ScriptedPolicy(tokenizer, reply)


def comparable(messages, rewards_and_metrics) -> tuple:
    """An episode as the equality tests compare it: chat dicts (tool-call arguments parsed, ids dropped),
    the reward and the metrics."""
    from textenv.gym.verifiers_messages import chat_dicts

    normalised = []
    for message in chat_dicts(messages, "messages"):
        message = {key: value for key, value in message.items() if key not in ("tool_call_id", "name")}
        if "tool_calls" in message:
            message["tool_calls"] = [(call["function"]["name"], _arguments(call["function"]["arguments"])) for call in message["tool_calls"]]
        normalised.append(message)
    return json.dumps(normalised, sort_keys=True), json.dumps(rewards_and_metrics, sort_keys=True)


def _arguments(arguments):
    return json.loads(arguments) if isinstance(arguments, str) else arguments
