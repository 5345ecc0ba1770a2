"""Every tool-call format (tests/tool_call_writers.py writes each as its family does), the same behaviours for all:
one call, several, unicode and nested arguments, a call cut by the turn budget, thinking before the calls (with a
decoy call in it), content around the calls, a malformed call, the family's end-of-turn strings, plain text."""

import pytest
from tool_call_writers import FORMATS, Format

NAMES = sorted(FORMATS)
NESTED = {"ville": "Zürich 🌧 «été»", "filtres": {"unités": ["°C", "mm"], "jours": [1, 2.5, None, True], "vide": {}},
          "n": -3, "ok": False, "texte": "ligne 1\nligne 2 \"citée\" \\ fin"}


def read(format: Format, calls, text=None):
    """`[(name, arguments, error)]` of `text` (default: `calls` as the format writes them)."""
    text = format.write(calls) if text is None else text
    return [(call.name, call.arguments, call.error) for call in format.parse(text, calls).calls]


@pytest.fixture(params=NAMES)
def format(request) -> Format:
    return FORMATS[request.param]


def test_one_call(format):
    calls = [("get_weather", {"city": "Paris"})]
    text = format.write(calls)
    turn = format.parse(text, calls)
    assert [(call.name, call.arguments, call.error) for call in turn.calls] == [("get_weather", {"city": "Paris"}, None)]
    assert turn.content == "" and turn.reasoning == ""
    assert turn.calls[0].text and turn.calls[0].text in text


def test_several_calls_in_order(format):
    calls = [("get_weather", {"city": "Paris"}), ("ping", {}), ("get_weather", {"city": "Oslo", "days": 2})]
    assert read(format, calls) == [(name, arguments, None) for name, arguments in calls]


def test_unicode_and_nested_arguments(format):
    calls = [("météo_recherche", NESTED), ("ping", {})]
    assert read(format, calls) == [("météo_recherche", NESTED, None), ("ping", {}, None)]


def test_call_cut_by_the_turn_budget_has_an_error(format):
    calls = [("ping", {}), ("get_weather", {"city": "Zürich", "note": "CUTHERE and the rest"})]
    written = format.write(calls)
    text = written[: written.index("CUTHERE") + 3]
    turn = format.parse(text, calls)
    assert [(call.name, call.arguments, call.error) for call in turn.calls[:1]] == [("ping", {}, None)]
    assert len(turn.calls) == 2
    cut = turn.calls[1]
    assert cut.error and cut.arguments is None and cut.name in ("get_weather", None)
    assert cut.text and cut.text in text and "CUT" in cut.text


def test_thinking_before_the_calls_is_reasoning_not_calls(format):
    decoy = format.write([("decoy", {"x": 1})]) if format.decoy_in_thinking else "I could call functions.decoy"
    calls = [("get_weather", {"city": "Paris"})]
    turn = format.parse(format.think(f"First I reason. {decoy}") + format.write(calls), calls)
    assert [(call.name, call.arguments, call.error) for call in turn.calls] == [("get_weather", {"city": "Paris"}, None)]
    assert turn.reasoning.startswith("First I reason.") and "decoy" in turn.reasoning


def test_thinking_cut_before_any_call_reads_no_call(format):
    decoy = format.write([("decoy", {"x": 1})]) if format.decoy_in_thinking else "functions.decoy"
    thinking = format.think(f"Still reasoning {decoy} END")
    text = thinking[: thinking.index("END") + 3]
    turn = format.parse(text)
    assert turn.calls == [] and turn.reasoning.startswith("Still reasoning")


def test_content_around_the_calls(format):
    calls = [("get_weather", {"city": "Paris"}), ("ping", {})]
    turn = format.parse(format.before + format.write(calls) + format.after, calls)
    assert [(call.name, call.arguments, call.error) for call in turn.calls] == [(name, arguments, None) for name, arguments in calls]
    first, last = format.shown
    assert turn.content.startswith(first) and turn.content.endswith(last) and "get_weather" not in turn.content


def test_malformed_call_has_an_error_and_keeps_its_text(format):
    turn = format.parse(format.malformed)
    (call,) = turn.calls
    assert call.error and call.arguments is None
    assert call.text and call.text in format.malformed


def test_malformed_call_does_not_hide_the_good_ones(format):
    good = format.write([("ping", {})])
    turn = format.parse(good + "\n" + format.malformed + "\n" + good)
    if format.parser == "llama3":  # no markers around a call: an undecodable one takes the rest of the turn
        assert [call.error is None for call in turn.calls] == [True, False] and turn.calls[1].text.endswith(good)
        return
    assert [call.error is None for call in turn.calls] == [True, False, True]
    assert [call.name for call in turn.calls][::2] == ["ping", "ping"]


@pytest.mark.parametrize("name", NAMES)
def test_end_of_turn_strings_are_tolerated(name):
    format = FORMATS[name]
    calls = [("get_weather", {"city": "Paris"}), ("ping", {})]
    expected = read(format, calls)
    for ending in format.end_of_turn:
        assert read(format, calls, format.write(calls) + ending + "\n") == expected, ending
        assert read(format, calls, format.write(calls) + ending + ending) == expected, ending


def test_plain_text_has_no_calls(format):
    turn = format.parse("  The answer is 4 [1] (see above). \n")
    assert (turn.content, turn.calls, turn.reasoning) == ("The answer is 4 [1] (see above).", [], "")
