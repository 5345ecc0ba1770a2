"""Chat-template rendering, one message at a time.

Earlier turns are never re-rendered: the text new messages add is the difference between the template's
rendering with and without them (a delta). Most templates are append-only (ChatML, Llama, Mistral within
a tool loop), so the delta of the real conversation is exact. A template that rewrites earlier messages
(thinking models that strip `<think>` from earlier replies, Mistral's tool list moving to the last user
message) gets the delta after a stand-in of the conversation instead: the system message, the last user
message and what follows it, with assistant contents replaced by a placeholder. The tokens already in an
episode stay exactly as they were.
"""

from __future__ import annotations

import copy
import json
import threading
import weakref
from typing import Any, Dict, Iterable, List, Optional

import torch

from textenv.environment.syntax import neutralize

Message = Dict[str, Any]
Messages = List[Message]

_SENTINEL = "\u2063TEXTENV-CONTENT\u2063"
_PLACEHOLDER = "\u2063"
RENDER_CACHE_SIZE = 256  # a few renders per episode in flight (a Gym run's episodes share one renderer)


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be rendered incrementally."""


class ChatRenderer:
    """Renders messages with a tokenizer's chat template and tokenizes the pieces.

    Args:
        tokenizer: a tokenizer with a chat template. A private copy is used for encoding, so the
            generation thread may use the original at the same time.
        tools (`list[dict]`, *optional*): JSON schemas passed to the template as `tools=` on every render.
        chat_template (`str`, *optional*): a template used instead of the tokenizer's own.
    """

    def __init__(self, tokenizer, tools: Optional[List[dict]] = None, chat_template: Optional[str] = None):
        if not (chat_template or getattr(tokenizer, "chat_template", None)):
            raise ChatTemplateError(
                "the tokenizer has no chat template; conversations need one (set tokenizer.chat_template or pass chat_template=)."
            )
        self.tokenizer = _private_copy(tokenizer)
        self.tools = list(tools) if tools else None
        self.chat_template = chat_template
        self.special_tokens = control_tokens(tokenizer)
        self.eos_text: Optional[str] = tokenizer.eos_token
        self.arguments_as_json = False  # set when the template refuses tool-call arguments given as a mapping
        self._deltas_used: Dict[str, int] = {}
        self._rendered: Dict[tuple, str] = {}  # render key -> text, oldest first
        self._cache_lock = threading.Lock()

    def with_tools(self, tools: Optional[List[dict]]) -> "ChatRenderer":
        """A renderer of the same tokenizer and template that describes `tools` to the model."""
        renderer = copy.copy(self)
        renderer.tools = list(tools) if tools else None
        renderer._deltas_used = {}
        renderer._rendered, renderer._cache_lock = {}, threading.Lock()
        return renderer

    def render(self, messages: Messages, add_generation_prompt: bool = False, tools: Any = "default") -> str:
        """The template's text for `messages` (with this renderer's tools unless `tools` is given). A template that
        takes tool-call arguments only as a JSON string (DeepSeek V3's) gets them so, from its first refusal on.
        The last `RENDER_CACHE_SIZE` renders are kept: a turn renders its conversation several times (the
        generation prompt, the reply's closing, the next message's delta)."""
        try:
            key = (json.dumps(messages), add_generation_prompt, tools == "default" or json.dumps(tools), self.arguments_as_json)
        except (TypeError, ValueError):  # not JSON (an image, a tensor): its text is no key for its content
            return self._render_uncached(messages, add_generation_prompt, tools)
        with self._cache_lock:
            text = self._rendered.get(key)
        if text is None:
            text = self._render_uncached(messages, add_generation_prompt, tools)
            with self._cache_lock:
                self._rendered[key] = text
                while len(self._rendered) > RENDER_CACHE_SIZE:
                    self._rendered.pop(next(iter(self._rendered)))
        return text

    def _render_uncached(self, messages: Messages, add_generation_prompt: bool, tools: Any) -> str:
        if self.arguments_as_json:
            return self._render(with_json_arguments(messages), add_generation_prompt, tools)
        try:
            return self._render(messages, add_generation_prompt, tools)
        except Exception:
            if not _has_mapping_arguments(messages):
                raise
            text = self._render(with_json_arguments(messages), add_generation_prompt, tools)
            self.arguments_as_json = True
            return text

    def _render(self, messages: Messages, add_generation_prompt: bool, tools: Any) -> str:
        extra = {"chat_template": self.chat_template} if self.chat_template else {}
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=self.tools if tools == "default" else tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **extra,
        )

    def encode(self, text: str) -> torch.Tensor:
        """Token ids of template text (special-token strings become their ids; no BOS is added)."""
        return torch.tensor(self.tokenizer(text, add_special_tokens=False).input_ids, dtype=torch.long)

    def added_text(self, before: Messages, new: Messages, add_generation_prompt: bool = False) -> str:
        """The text `new` messages (and the generation prompt, if asked) add after `before`.

        Tried in order: the real conversation's rendering as a prefix (append-only templates); after a
        final assistant reply, the text that follows its closing; the same after a stand-in conversation
        (`stand_in`), with at most one call per turn, and without tools.

        Raises:
            ChatTemplateError: no way gives the text.
        """
        if not before:
            return self.render(new, add_generation_prompt)
        paths = (
            ("append", lambda: self._prefix_delta(before, new, add_generation_prompt, "default")),
            ("after the reply", lambda: self._added_after_reply(before, new, add_generation_prompt)),
            ("stand-in", lambda: self._prefix_delta(stand_in(before), new, add_generation_prompt, "default")),
            ("stand-in, one call per turn", lambda: self._prefix_delta(stand_in(before, 1), new, add_generation_prompt, "default")),
            ("stand-in without tools", lambda: self._prefix_delta(stand_in(before, 1), new, add_generation_prompt, None)),
        )
        for path, delta in paths:
            text = delta()
            if text is not None:
                self._deltas_used[path] = self._deltas_used.get(path, 0) + 1
                return text
        roles = [message.get("role") for message in new]
        raise ChatTemplateError(
            f"the chat template rewrites earlier messages when {roles or 'the generation prompt'} is added, even after "
            "a stand-in conversation; textenv keeps the exact generated tokens and needs the text new messages add. "
            "Pass a template that renders messages in order (chat_template=)."
        )

    def _prefix_delta(self, base: Messages, new: Messages, add_generation_prompt: bool, tools: Any) -> Optional[str]:
        """What rendering `new` after `base` adds, if `base`'s rendering is a prefix of it."""
        try:
            shorter = self.render(base, tools=tools)
            longer = self.render([*base, *new], add_generation_prompt, tools=tools)
        except Exception:  # noqa: BLE001 - a template may refuse a shape (Llama 3.1: one call per turn)
            return None
        return longer[len(shorter) :] if longer.startswith(shorter) else None

    def _added_after_reply(self, before: Messages, new: Messages, add_generation_prompt: bool) -> Optional[str]:
        """When `before` ends with an assistant reply whose rendering changes once it is no longer the last
        message (Qwen3's empty think block): the text after that reply's closing, found by rendering the
        reply with a sentinel content."""
        if before[-1].get("role") != "assistant":
            return None
        try:
            closing = self.assistant_suffix(before[:-1])
            marked = self.render([*before[:-1], {**before[-1], "content": _SENTINEL}, *new], add_generation_prompt)
        except Exception:  # noqa: BLE001 - then the stand-ins are tried
            return None
        start = marked.find(_SENTINEL)
        if start < 0:
            return None
        after = marked[start + len(_SENTINEL) :]
        end = after.find(closing) if closing else -1
        if end >= 0:
            return after[end + len(closing) :]
        # A reply closed differently once others follow it (GPT-OSS: <|return|> becomes <|end|>): the model's own
        # closing token stays in the episode; the delta starts after the template's.
        rewritten = next((token for token in self.special_tokens if token and after.startswith(token)), None)
        return after[len(rewritten) :] if rewritten else None

    def reply_continuation(self, before: Messages, reply: Message, written: str, prompt: str) -> Optional[tuple[str, str]]:
        """How the template goes on after the model's text `written` (its turn, the token that ended it included, after
        the generation prompt `prompt`), when it renders `reply` as the model wrote it: `(closing, overlap)`, the text
        it puts after `written` and, when the model wrote past the template's rendering of the reply, that excess
        (which the template writes at the start of what follows). `None` when the template renders it otherwise."""
        rendered = self._prefix_delta(before, [reply], False, "default")
        if not rendered or not rendered.startswith(prompt) or len(rendered) == len(prompt):
            return None
        rendered = rendered[len(prompt) :]
        if rendered.startswith(written):
            return rendered[len(written) :], ""
        return ("", written[len(rendered) :]) if written.startswith(rendered) else None

    def message_text(self, before: Messages, message: Message) -> str:
        """The text `message` adds after `before`."""
        return self.added_text(before, [message])

    def generation_prompt(self, messages: Messages) -> str:
        """The text that opens the assistant's turn after `messages` (e.g. ``<|im_start|>assistant\\n``)."""
        return self.added_text(messages, [], add_generation_prompt=True)

    def assistant_suffix(self, messages: Messages) -> str:
        """The text the template puts after an assistant reply's content (e.g. ``<|im_end|>\\n``)."""
        closed = self.render([*messages, {"role": "assistant", "content": _SENTINEL}])
        if _SENTINEL not in closed:
            raise ChatTemplateError(
                "the chat template does not render an assistant reply's content as given; textenv needs the text "
                "the template puts after the model's own tokens."
            )
        return closed.split(_SENTINEL, 1)[1]

    @property
    def deltas_used(self) -> Dict[str, int]:
        """How many deltas each way of `added_text` gave, by name."""
        return dict(self._deltas_used)

    def neutralize(self, text: str, extra: Iterable[str] = ()) -> str:
        """`text` with the tokenizer's special tokens (and `extra` strings) defused."""
        return neutralize(text, [*self.special_tokens, *extra])


def control_tokens(tokenizer) -> List[str]:
    """The tokenizer's special tokens: the named ones and every added token its vocabulary marks special (a released
    tokenizer.json marks GPT-OSS's ``<|end|>`` and Llama 3's ``<|start_header_id|>`` special without listing them in
    `all_special_tokens`; text spelling them is encoded as the control token all the same)."""
    added = [token.content for token in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(token, "special", False)]
    return list(dict.fromkeys([*tokenizer.all_special_tokens, *added]))


def stand_in(messages: Messages, max_calls: Optional[int] = None) -> Messages:
    """The conversation a delta is rendered after when the real one is rewritten by its template: the
    system message, the last user message and what follows it, every assistant content a placeholder
    (and at most `max_calls` tool calls per assistant message, for templates that take one)."""
    head = messages[:1] if messages and messages[0].get("role") == "system" else []
    last_user = max((index for index, message in enumerate(messages) if message.get("role") == "user"), default=len(head))
    tail = []
    for message in messages[max(last_user, len(head)) :]:
        if message.get("role") == "assistant":
            message = {**message, "content": _PLACEHOLDER}
            if max_calls is not None and message.get("tool_calls"):
                message["tool_calls"] = message["tool_calls"][:max_calls]
        tail.append(message)
    return head + tail


def _has_mapping_arguments(messages: Messages) -> bool:
    return any(isinstance(call.get("function", call).get("arguments"), dict) for message in messages for call in message.get("tool_calls") or [])


def with_json_arguments(messages: Messages) -> Messages:
    """`messages` with every tool call's mapping `arguments` as a JSON string (OpenAI's form)."""
    def encoded(call: dict) -> dict:
        function = call.get("function", call)
        if not isinstance(function.get("arguments"), dict):
            return call
        function = {**function, "arguments": json.dumps(function["arguments"], ensure_ascii=False)}
        return {**call, "function": function} if "function" in call else function

    return [{**message, "tool_calls": [encoded(call) for call in message["tool_calls"]]} if message.get("tool_calls") else message
            for message in messages]


def tool_call_message(content: str, tool_calls: List[dict]) -> Message:
    """An assistant message in the chat-template form: `content` and OpenAI-style `tool_calls`."""
    message: Message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


_private_copies: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _private_copy(tokenizer):
    """One copy per tokenizer (copying takes ~0.5 s), shared by every renderer of that tokenizer; they
    all run on event-loop threads, while the original is used by the generation thread."""
    try:
        if tokenizer not in _private_copies:
            _private_copies[tokenizer] = copy.deepcopy(tokenizer)
        return _private_copies[tokenizer]
    except Exception:  # noqa: BLE001 - an uncopyable tokenizer is shared (encode/decode are read-only)
        return tokenizer
