"""Property tests: the parser never raises, histories keep their invariants for any segment sequence.

Comparisons: all exact (strings, integer token ids and masks).
"""

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from textenv import TextHistory, parse_tool_call
from textenv.environment.syntax import CONTROL_TAGS, neutralize

TAGGY_TEXT = st.lists(
    st.sampled_from(list("<>abc|/ \n=1") + ["<request>", "<call>", "<response>", "<submit>", "<Tool>", "<>"]),
    max_size=30,
).map("".join)
ANY_TEXT = st.one_of(st.text(max_size=200), TAGGY_TEXT)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(ANY_TEXT)
@example("<request>><><call>")  # the query (after the first ">") starts before the tool tag
def test_parse_tool_call_never_raises_and_agrees_with_the_syntax(text):
    tool, query = parse_tool_call(text)
    if tool is None or query is None:
        assert (tool, query) == (None, None)
        return
    # A parsed call really is <request>...<tool>...<call> in the text; the query ends the request span.
    assert "<request>" in text and "<call>" in text
    after_request = text[text.index("<request>") + len("<request>") :]
    request_span = after_request[: after_request.index("<call>")]
    assert f"<{tool}>" in request_span
    assert request_span.endswith(query) and len(query) < len(request_span)
    assert parse_tool_call("prefix " + text) == (tool, query)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.one_of(st.none(), st.integers(), st.binary(), st.lists(st.text())))
def test_parse_tool_call_of_non_text_gives_none(value):
    assert parse_tool_call(value) == (None, None)


SEGMENT = st.tuples(
    st.text(min_size=1, max_size=20),
    st.lists(st.integers(min_value=0, max_value=49151), min_size=1, max_size=8),
    st.booleans(),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(SEGMENT, min_size=1, max_size=12))
def test_history_invariants_hold_for_any_segments(segments):
    (first_text, first_tokens, first_system), *rest = segments
    history = TextHistory(first_text, torch.tensor(first_tokens), system=first_system)
    for text, tokens, system in rest:
        history.append_segment(text, torch.tensor(tokens), system=system)

    assert len(history.tokens) == len(history.token_masks) == history.token_spans[-1][1]
    assert history.text == "".join(text for text, _, _ in segments)
    assert history.tokens.tolist() == [t for _, tokens, _ in segments for t in tokens]
    spans = history.token_spans
    text_spans = history.text_spans
    assert spans[0][0] == 0 and text_spans[0][0] == 0 and text_spans[-1][1] == len(history.text)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert all(a[1] == b[0] for a, b in zip(text_spans, text_spans[1:]))
    for (start, end), (_, tokens, system) in zip(spans, segments):
        assert history.token_masks[start:end].tolist() == [0 if system else 1] * len(tokens)
    query, response, mask = history.split_query_response_tokens()
    assert query.tolist() == first_tokens
    assert torch.equal(torch.cat([query, response]), history.tokens)
    assert len(mask) == len(response) and torch.equal(mask, history.token_masks[len(first_tokens) :])
    assert history.last_text_segment == segments[-1][0]


SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.one_of(st.text(max_size=10), st.sampled_from([*CONTROL_TAGS, *SPECIALS])), max_size=15))
def test_neutralised_text_holds_no_control_string(pieces):
    text = neutralize("".join(pieces), [*CONTROL_TAGS, *SPECIALS])
    for forbidden in [*CONTROL_TAGS, *SPECIALS]:
        assert forbidden not in text
    assert parse_tool_call(text) == (None, None) or "<request>" not in text
