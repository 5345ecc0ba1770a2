"""Which parser a chat template's text calls for, resolving ``--tool_parser`` names, and every parser on random
text made of every format's markers (never raises, keeps its contract)."""

import random

import pytest

from textenv.tools.tool_call_parsers import TOOL_CALL_PARSERS, ParsedTurn, get_tool_call_parser, parser_for_template


@pytest.mark.parametrize("template, parser", [
    ("{{ '[TOOL_CALLS]' + name + '[ARGS]' }}", "mistral"),
    ("<|start|>assistant to=functions.x<|channel|>commentary json<|message|>{}<|call|>", "gpt_oss"),
    ("<｜tool▁call▁begin｜>{{ type }}<｜tool▁sep｜>{{ name }}\n```json\n{{ args }}\n```", "deepseek_v3"),
    ("<｜tool▁call▁begin｜>{{ name }}<｜tool▁sep｜>{{ args }}<｜tool▁call▁end｜>", "deepseek_v31"),
    ("{{ '<|tool_call>call:' + name }}", "gemma4"),
    ("<tool_call>{{ name }}\n<arg_key>{{ k }}</arg_key>", "glm4"),
    ("<tool_call>\n<function={{ name }}>\n<parameter={{ k }}>", "qwen3_coder"),
    ("<tool_call>\n{{ call | tojson }}\n</tool_call>", "hermes"),
    ("{{ '<|tool|>' + message['tools'] + '<|/tool|>' }}", "phi4_mini"),
    ("<|tool_call_start|>[{{ calls }}]<|tool_call_end|>", "pythonic"),
    ("<|tool_list_start|>{{ tools }}<|tool_list_end|>", "pythonic"),
    ("{{ '<|python_tag|>' }}", "llama3"),
    ("<|start_header_id|>{{ '\"parameters\": ' }}", "llama3"),
    ("<|header_start|>assistant<|header_end|>{{ '\"parameters\": ' }}", "llama3"),
    ("<|start_header_id|>{{ m.content }}", "hermes"),  # a Llama 3 template that cannot call tools
    ("<|im_start|>{{ m.content }}<|im_end|>", "hermes"),  # unknown: textenv's own format
    ("", "hermes"),
    (None, "hermes"),
])
def test_parser_for_template_markers(template, parser):
    assert parser_for_template(template) == parser


def test_every_parser_name_resolves_and_an_unknown_one_is_a_one_line_error():
    for name, parse in TOOL_CALL_PARSERS.items():
        assert get_tool_call_parser(name) is parse
    with pytest.raises(ValueError) as raised:
        get_tool_call_parser("qwen35")
    message = str(raised.value)
    assert "\n" not in message and "--tool_parser" in message and "'qwen35'" in message
    assert all(repr(name) in message for name in TOOL_CALL_PARSERS)
    assert set(TOOL_CALL_PARSERS) >= {"hermes", "qwen", "llama3", "mistral", "qwen3_coder", "glm4", "gpt_oss", "deepseek_v3",
                                      "deepseek_v31", "pythonic", "phi4_mini", "gemma4"}


def test_parsed_turn_reasoning_defaults_to_empty():
    assert ParsedTurn("x", []) == ParsedTurn("x", [], "") and ParsedTurn("x", []) != ParsedTurn("x", [], "r")


FRAGMENTS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<function=f>", "</function>", "<parameter=a>", "</parameter>",
             "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<|start|>assistant", "<|channel|>", "analysis", "commentary",
             " to=functions.f", "<|constrain|>json", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<｜tool▁calls▁begin｜>",
             "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "```json", "<|tool_call_start|>", "<|tool_call_end|>",
             "<|python_start|>", "<|python_end|>", "<|tool_call|>", "<|/tool_call|>", "functools[", "<|tool_call>", "<tool_call|>",
             "call:f", '<|"|>', "<|channel>thought", "<channel|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]",
             "f(", "a=", ")", "(", "{", "}", "[", "]", '"', "'", ":", ",", "\n", " ", "1", "null", "None", "é", "\\", "x"]


@pytest.mark.parametrize("name", sorted(TOOL_CALL_PARSERS))
def test_parsers_never_raise_on_any_format_markers(name):
    parse = TOOL_CALL_PARSERS[name]
    rng = random.Random(47)
    texts = ["".join(rng.choices(FRAGMENTS, k=rng.randint(0, 40))) for _ in range(2000)]
    texts += [marker + opener * 20_000 for marker in ("<|tool_call_start|>", "<|tool_call>call:f", "<function=f>", "<tool_call>f\n")
              for opener in ("[", "{", "(", "[a,", "<parameter=a>")]
    for text in texts:
        turn = parse(text)
        assert isinstance(turn, ParsedTurn) and turn.content == turn.content.strip() and turn.reasoning == turn.reasoning.strip()
        for call in turn.calls:
            assert call.text and call.text in text
            if call.error is None:
                assert isinstance(call.name, str) and call.name.strip() and isinstance(call.arguments, dict)
            else:
                assert isinstance(call.error, str) and call.error
