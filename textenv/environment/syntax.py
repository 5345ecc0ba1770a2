"""The tool-call syntax: ``<request><ToolName>query<call>response<response>...<submit>``.

The tags are plain text that the model writes (they are not added to the vocabulary).
"""

from __future__ import annotations

import re
from typing import Iterable

REQUEST_TOKEN = "<request>"
CALL_TOKEN = "<call>"
RESPONSE_TOKEN = "<response>"
SUBMIT_TOKEN = "<submit>"
CONTROL_TAGS = (REQUEST_TOKEN, CALL_TOKEN, RESPONSE_TOKEN, SUBMIT_TOKEN)

# The shortest span after the first <request> that ends right before the next <call>.
_REQUEST_SPAN = re.compile(rf"(?<={re.escape(REQUEST_TOKEN)}).*?(?={re.escape(CALL_TOKEN)})", re.DOTALL)
_TOOL_TAG = re.compile(r"<(.*?)>", re.DOTALL)


def parse_tool_call(text: str) -> tuple[str | None, str | None]:
    """Find the tool call in the model's last segment.

    Args:
        text: the text the model wrote in its last turn.

    Returns:
        `(tool_name, query)`, or `(None, None)` when the text holds no complete
        ``<request><Name>query<call>``. The query is everything after the first ``>`` of the request span,
        so later ``>`` characters are kept.
    """
    if not isinstance(text, str):
        return None, None
    span = _REQUEST_SPAN.search(text)
    if span is None:
        return None, None
    request = span.group()
    tag = _TOOL_TAG.search(request)
    if tag is None:
        return None, None
    query = ">".join(request.split(">")[1:])
    return tag.group(1), query


def neutralize(text: str, forbidden: Iterable[str]) -> str:
    """Defuse control strings inside text that did not come from the model (tool responses, environment
    observations), so it cannot start, end or redirect an episode.

    Every occurrence of a forbidden string (the control tags, EOS and the tokenizer's special tokens)
    has its leading ``<`` replaced by the HTML entity ``&lt;`` and its trailing ``>`` by ``&gt;``:
    ``"<submit>"`` becomes ``"&lt;submit&gt;"`` and ``"<|im_end|>"`` becomes ``"&lt;|im_end|&gt;"``. The
    model still reads what the tool said, but the text no longer matches a tag, and the tokenizer no
    longer maps it to a special token id. Strings not wrapped in angle brackets are wrapped in the
    entities instead (``"</s>"`` style tokens are covered by the first rule).
    """
    for token in sorted({t for t in forbidden if t}, key=len, reverse=True):
        if token in text:
            text = text.replace(token, _escaped(token))
    return text


def _escaped(token: str) -> str:
    inner = token
    if inner.startswith("<"):
        inner = inner[1:]
    if inner.endswith(">"):
        inner = inner[:-1]
    return f"&lt;{inner}&gt;"
