"""The tool-call parsers (Hermes/Qwen, Llama 3, Mistral) on written text: their formats, unreadable calls, random
text, and which parser a chat template gets."""

import json
import random

import pytest
from chat_fixtures import _bundled_tokenizer, fixture_template

from textenv.tools.tool_call_parsers import (
    TOOL_CALL_PARSERS,
    ParsedTurn,
    ToolCall,
    get_tool_call_parser,
    parse_hermes,
    parse_llama3,
    parse_mistral,
    parser_for_template,
)

EOS_STRINGS = ["<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>"]


def hermes_block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


# ---------------------------------------------------------------- Hermes / Qwen


def test_hermes_single_call():
    block = hermes_block('{"name": "get_weather", "arguments": {"city": "Paris"}}')
    assert parse_hermes(block) == ParsedTurn("", [ToolCall("get_weather", {"city": "Paris"}, block)])


def test_hermes_several_calls_with_content_around():
    a = hermes_block('{"name": "a", "arguments": {"x": 1}}')
    b = hermes_block('{"name": "b", "arguments": {}}')
    turn = parse_hermes(f"Let me check.\n{a}\n{b}\nDone.")
    assert turn.content == "Let me check.\n\n\nDone."
    assert turn.calls == [ToolCall("a", {"x": 1}, a), ToolCall("b", {}, b)]


def test_hermes_nested_unicode_arguments():
    arguments = {"query": {"filters": [{"ville": "Zürich", "temp": "°C"}], "emoji": "🌧", "n": [1, 2.5, None, True]}}
    block = hermes_block(json.dumps({"name": "recherche_météo", "arguments": arguments}, ensure_ascii=False))
    (call,) = parse_hermes(block).calls
    assert (call.name, call.arguments, call.error) == ("recherche_météo", arguments, None)


@pytest.mark.parametrize(
    "body, arguments",
    [
        ('{"name": "f", "parameters": {"a": 1}}', {"a": 1}),  # alias
        ('{"name": "f"}', {}),  # missing
        ('{"name": "f", "arguments": null}', {}),
        ('{"name": "f", "arguments": "{\\"a\\": [1, 2]}"}', {"a": [1, 2]}),  # JSON string holding an object
        ('{"name": "f", "arguments": ""}', {}),
    ],
)
def test_hermes_argument_forms(body, arguments):
    (call,) = parse_hermes(hermes_block(body)).calls
    assert (call.name, call.arguments, call.error) == ("f", arguments, None)


@pytest.mark.parametrize(
    "body, name, error",
    [
        ('{"name": "f", "arguments": [1, 2]}', "f", "'arguments' must be a JSON object, got list"),
        ('{"name": "f", "parameters": 3}', "f", "'parameters' must be a JSON object, got int"),
        ('{"name": "f", "arguments": "[1, 2]"}', "f", "'arguments' must be a JSON object, got a string holding list"),
        ('{"name": "f", "arguments": "{oops"}', "f", "'arguments' is a string that is not valid JSON"),
        ('{"arguments": {"a": 1}}', None, "the call has no 'name'"),
        ('{"name": null, "arguments": {}}', None, "the call has no 'name'"),
        ('{"name": "", "arguments": {}}', None, "'name' must be a non-empty string, got an empty string"),
        ('{"name": 3, "arguments": {}}', None, "'name' must be a non-empty string, got int"),
        ("[1, 2]", None, "the call must be a JSON object, got list"),
        ('{"name": "f" "arguments": {}}', None, "malformed JSON: Expecting ',' delimiter: line 1 column 14"),
        ("", None, "malformed JSON: Expecting value: line 1 column 1"),
    ],
)
def test_hermes_unreadable_calls_keep_their_text(body, name, error):
    block = hermes_block(body)
    turn = parse_hermes(f"Intro {block} outro")
    (call,) = turn.calls
    assert call.name == name
    assert call.error is not None and call.error.startswith(error)
    assert call.text == block
    assert turn.content == "Intro  outro"


def test_hermes_missing_name_keeps_arguments():
    (call,) = parse_hermes(hermes_block('{"arguments": {"a": 1}}')).calls
    assert call.arguments == {"a": 1}


def test_hermes_unclosed_block_runs_to_end_of_turn():
    turn = parse_hermes('Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n<|im_end|>\n')
    assert turn == ParsedTurn("Sure.", [ToolCall("f", {"a": 1}, '<tool_call>\n{"name": "f", "arguments": {"a": 1}}')])
    cut = '<tool_call>\n{"name": "f", "argu'
    (call,) = parse_hermes(cut).calls
    assert call.name is None and call.arguments is None and call.text == cut
    assert call.error.startswith("malformed JSON")


def test_hermes_plain_text_has_no_calls():
    assert parse_hermes("  The answer is 4. </tool_call>\n") == ParsedTurn("The answer is 4. </tool_call>", [])


@pytest.mark.parametrize("eos", EOS_STRINGS)
def test_hermes_trailing_end_of_turn(eos):
    block = hermes_block('{"name": "f", "arguments": {}}')
    assert parse_hermes(f"Hi {block}{eos}\n ") == ParsedTurn("Hi", [ToolCall("f", {}, block)])


# ---------------------------------------------------------------- Llama 3


def test_llama3_single_call():
    text = '{"name": "get_weather", "parameters": {"city": "Paris", "opts": {"unit": "°C"}}}'
    assert parse_llama3(text) == ParsedTurn("", [ToolCall("get_weather", {"city": "Paris", "opts": {"unit": "°C"}}, text)])


@pytest.mark.parametrize("eos", EOS_STRINGS)
def test_llama3_python_tag_and_end_of_turn(eos):
    call = '{"name": "f", "arguments": {"a": 1}}'
    assert parse_llama3(f" <|python_tag|> {call}{eos}\n") == ParsedTurn("", [ToolCall("f", {"a": 1}, call)])


@pytest.mark.parametrize("separator", [";", "; ", "\n", " ;\n"])
def test_llama3_several_calls(separator):
    a, b = '{"name": "a", "parameters": {"x": 1}}', '{"name": "b", "parameters": {}}'
    assert parse_llama3(a + separator + b) == ParsedTurn("", [ToolCall("a", {"x": 1}, a), ToolCall("b", {}, b)])


@pytest.mark.parametrize(
    "text",
    ["The weather is nice.", 'Here it is: {"name": "f", "parameters": {}}', '<|python_tag|>brave_search.call(query="x")', ""],
)
def test_llama3_plain_content(text):
    assert parse_llama3(text) == ParsedTurn(text, [])


def test_llama3_malformed_json_is_one_call():
    text = '{"name": "f", "parameters": {"x": 1}'
    (call,) = parse_llama3(text).calls
    assert (call.name, call.arguments, call.text) == (None, None, text)
    assert call.error.startswith("malformed JSON: Expecting ',' delimiter")


def test_llama3_second_call_cut_off():
    first, second = '{"name": "a", "parameters": {}}', '{"name": "b", "par'
    turn = parse_llama3(f"{first}; {second}")
    assert turn.calls[0] == ToolCall("a", {}, first)
    assert turn.calls[1].error.startswith("malformed JSON") and turn.calls[1].text == second
    assert len(turn.calls) == 2


def test_llama3_text_after_calls_is_content_and_string_arguments_are_decoded():
    call = '{"name": "a", "parameters": "{\\"q\\": \\"x\\"}"}'
    assert parse_llama3(f"{call}\nDone.") == ParsedTurn("Done.", [ToolCall("a", {"q": "x"}, call)])


def test_llama3_object_without_name():
    (call,) = parse_llama3('{"answer": 4}').calls
    assert (call.name, call.error, call.text) == (None, "the call has no 'name'", '{"answer": 4}')


# ---------------------------------------------------------------- Mistral


def test_mistral_list_format_keeps_id():
    element = '{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123XYZ"}'
    turn = parse_mistral(f"[TOOL_CALLS] [{element}]</s>")
    assert turn == ParsedTurn("", [ToolCall("get_weather", {"city": "Paris"}, element, None, "abc123XYZ")])


def test_mistral_list_several_calls_and_content():
    a, b = '{"name": "a", "arguments": {"x": {"y": [1]}}}', '{"name": "b", "parameters": {}}'
    turn = parse_mistral(f"Checking.[TOOL_CALLS][{a},\n {b}] after\n")
    assert turn == ParsedTurn("Checking. after", [ToolCall("a", {"x": {"y": [1]}}, a), ToolCall("b", {}, b)])


def test_mistral_args_format():
    one = '[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich"}'
    assert parse_mistral(f"Hi {one}") == ParsedTurn("Hi", [ToolCall("get_weather", {"city": "Zürich"}, one)])
    a, b = '[TOOL_CALLS]a[ARGS]{"x": 1}', "[TOOL_CALLS]b[ARGS] {}"
    assert parse_mistral(a + b + "</s>").calls == [ToolCall("a", {"x": 1}, a), ToolCall("b", {}, b)]


def test_mistral_malformed_list():
    cut = '{"name": "a", "arguments": {"x": 1}'
    (call,) = parse_mistral(f"[TOOL_CALLS] [{cut}").calls
    assert (call.name, call.text) == (None, cut) and call.error.startswith("malformed JSON")
    good = '{"name": "a", "arguments": {}}'
    turn = parse_mistral(f'[TOOL_CALLS] [{good}, {{"name": "b", "argu')
    assert turn.calls[0] == ToolCall("a", {}, good)
    assert turn.calls[1].error.startswith("malformed JSON") and turn.calls[1].text == '{"name": "b", "argu'


@pytest.mark.parametrize(
    "text, name, error",
    [
        ('[TOOL_CALLS]a[ARGS]{"x":', None, "malformed JSON: Expecting value: line 1 column 6"),
        ("[TOOL_CALLS]get_weather", None, "expected a JSON list or 'name[ARGS]{...}'"),
        ("[TOOL_CALLS]", None, "expected a JSON list or 'name[ARGS]{...}'"),
        ("[TOOL_CALLS][ARGS]{}", None, "the call has no 'name'"),
        ("[TOOL_CALLS]a[ARGS][1]", "a", "'arguments' must be a JSON object, got list"),
    ],
)
def test_mistral_args_format_errors(text, name, error):
    (call,) = parse_mistral(text).calls
    assert call.name == name and call.error.startswith(error) and call.text == text


def test_mistral_plain_content():
    assert parse_mistral(" Paris is sunny.</s>") == ParsedTurn("Paris is sunny.", [])


# ---------------------------------------------------------------- robustness


FRAGMENTS = ["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"', ":", ",", ";", "\n", " ", "[TOOL_CALLS]", "[ARGS]",
             "<|python_tag|>", "<|im_end|>", "</s>", '"name"', '"arguments"', '"parameters"', "null", "1", "é", "\\"]


@pytest.mark.parametrize("name", sorted(TOOL_CALL_PARSERS))
def test_parsers_never_raise_on_random_text(name):
    parse = TOOL_CALL_PARSERS[name]
    rng = random.Random(1234)
    texts = ["<tool_call>" + "[" * 100_000, "[TOOL_CALLS]" + "[" * 100_000, "{" * 100_000, '{"a": ' * 50_000,
             '{"name": "f", "arguments": {"x": ' + "1" * 5000 + "}}"]
    texts += ["".join(rng.choices(FRAGMENTS, k=rng.randint(0, 30))) for _ in range(3000)]
    texts += ["".join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(0, 40))) for _ in range(500)]
    for text in texts:
        turn = parse(text)
        assert isinstance(turn, ParsedTurn) and turn.content == turn.content.strip()
        for call in turn.calls:
            assert call.text and call.text in text
            if call.error is None:
                assert isinstance(call.name, str) and call.name.strip() and isinstance(call.arguments, dict)
            else:
                assert isinstance(call.error, str) and call.error


# ---------------------------------------------------------------- choosing a parser


@pytest.mark.parametrize(
    "name, parser",
    [("hermes_qwen", "hermes"), ("qwen3_thinking", "hermes"), ("llama3", "llama3"), ("mistral", "mistral")],
)
def test_parser_for_fixture_templates(name, parser):
    assert parser_for_template(fixture_template(name)) == parser


def test_parser_for_other_templates():
    assert parser_for_template(None) == "hermes"
    assert parser_for_template(_bundled_tokenizer().chat_template) == "hermes"  # plain ChatML
    assert parser_for_template("{{ '<|python_tag|>' }}") == "llama3"
    assert parser_for_template("<|start_header_id|>{{ m.content }}") == "hermes"
    assert parser_for_template("[TOOL_CALLS] <tool_call>") == "mistral"


def test_get_tool_call_parser():
    assert get_tool_call_parser("hermes") is parse_hermes and get_tool_call_parser("qwen") is parse_hermes
    assert get_tool_call_parser("llama3") is parse_llama3 and get_tool_call_parser("mistral") is parse_mistral

    def custom(text):
        return ParsedTurn(text, [])

    assert get_tool_call_parser(custom) is custom
    with pytest.raises(ValueError, match=r"tool_parser='nope'.*'hermes', 'qwen', 'llama3', 'mistral'"):
        get_tool_call_parser("nope")
    for bad in (None, 3):
        with pytest.raises(TypeError, match="tool_parser"):
            get_tool_call_parser(bad)
