"""The tool-call parsers against the chat-template fixtures (tests/fixtures/chat_templates): what each template
writes for a tool call parses back to that call, and the fixtures render as the real templates do."""

import json

import pytest
from chat_fixtures import FIXTURE_SPECIAL_TOKENS, FIXTURE_TEMPLATES, _bundled_tokenizer, fixture_template, fixture_tokenizer
from jinja2.exceptions import TemplateError

from textenv.tools.tool_call_parsers import parse_hermes, parse_llama3, parse_mistral

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ARGUMENTS = {"city": "Zürich", "opts": {"unit": "°C", "days": [1, 2]}}
FIXTURE_PARSER = {"hermes_qwen": parse_hermes, "qwen3_thinking": parse_hermes, "llama3": parse_llama3, "mistral": parse_mistral}


def conversation(arguments=ARGUMENTS, calls=1):
    tool_calls = [{"id": f"abc123XY{i}", "type": "function", "function": {"name": f"get_weather{i or ''}", "arguments": arguments}}
                  for i in range(calls)]
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": tool_calls},
        *[{"role": "tool", "tool_call_id": f"abc123XY{i}", "content": f"result {i}"} for i in range(calls)],
        {"role": "assistant", "content": "It is 22 °C."},
    ]


def assistant_turn(tokenizer, messages, index):
    """The text the template writes for `messages[index]` (an assistant message)."""
    before = tokenizer.apply_chat_template(messages[:index], tools=TOOLS, tokenize=False, add_generation_prompt=True)
    upto = tokenizer.apply_chat_template(messages[: index + 1], tools=TOOLS, tokenize=False)
    assert upto.startswith(before)
    return upto[len(before):]


@pytest.mark.parametrize("arguments", [ARGUMENTS, json.dumps(ARGUMENTS, ensure_ascii=False)], ids=["dict", "string"])
@pytest.mark.parametrize("name", FIXTURE_TEMPLATES)
def test_fixture_round_trip(name, arguments):
    tokenizer = fixture_tokenizer(name)
    messages = conversation(arguments)
    rendered = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert "get_weather" in rendered and "Weather in Zürich?" in rendered and "result 0" in rendered
    assert "It is 22 °C." in rendered and "Be brief." in rendered
    turn = FIXTURE_PARSER[name](assistant_turn(tokenizer, messages, 2))
    assert [(call.name, call.arguments, call.error) for call in turn.calls] == [("get_weather", ARGUMENTS, None)]
    assert turn.content == ("<think>\n\n</think>" if name == "qwen3_thinking" else "")  # Qwen3 thinks last turn
    assert FIXTURE_PARSER[name](assistant_turn(tokenizer, messages, len(messages) - 1)).calls == []


@pytest.mark.parametrize("name", ["hermes_qwen", "qwen3_thinking", "mistral"])
def test_fixture_round_trip_several_calls(name):
    tokenizer = fixture_tokenizer(name)
    messages = conversation(calls=2)
    turn = FIXTURE_PARSER[name](assistant_turn(tokenizer, messages, 2))
    assert [(call.name, call.arguments) for call in turn.calls] == [("get_weather", ARGUMENTS), ("get_weather1", ARGUMENTS)]


@pytest.mark.parametrize("name", FIXTURE_TEMPLATES)
def test_fixture_accepts_flat_tool_calls(name):
    tokenizer = fixture_tokenizer(name)
    nested = conversation()
    flat = conversation()
    flat[2]["tool_calls"] = [{"id": "abc123XY0", "name": "get_weather", "arguments": ARGUMENTS}]
    rendered = tokenizer.apply_chat_template(flat, tools=TOOLS, tokenize=False)
    assert rendered == tokenizer.apply_chat_template(nested, tools=TOOLS, tokenize=False)
    assert '"get_weather"' in rendered


def test_fixture_tokenizer_special_tokens_and_original_untouched():
    for name, tokens in FIXTURE_SPECIAL_TOKENS.items():
        tokenizer = fixture_tokenizer(name)
        assert (tokenizer.eos_token, tokenizer.bos_token) == (tokens["eos_token"], tokens["bos_token"])
        for token in tokens["additional_special_tokens"]:
            assert tokenizer.tokenize(f"a{token}b") == ["a", token, "b"]
    bundled = _bundled_tokenizer()
    assert bundled.eos_token == "<|im_end|>" and "[TOOL_CALLS]" not in bundled.get_vocab()
    assert bundled.chat_template != fixture_template("mistral")
    assert fixture_tokenizer("hermes_qwen").chat_template == fixture_template("hermes_qwen")


def test_hermes_fixture_groups_tool_results_and_default_system():
    tokenizer = fixture_tokenizer("hermes_qwen")
    rendered = tokenizer.apply_chat_template(conversation(calls=2), tools=TOOLS, tokenize=False)
    assert "<|im_start|>user\n<tool_response>\nresult 0\n</tool_response>\n<tool_response>\nresult 1\n</tool_response><|im_end|>" in rendered
    assert rendered.count("<|im_start|>user") == 2
    plain = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert plain == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_qwen3_fixture_drops_thinking_before_last_user_message():
    tokenizer = fixture_tokenizer("qwen3_thinking")
    messages = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nold reasoning\n</think>\n\nA1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "<think>\nnew reasoning\n</think>\n\nA2"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert "old reasoning" not in rendered and "<|im_start|>assistant\nA1<|im_end|>" in rendered
    assert "<|im_start|>assistant\n<think>\nnew reasoning\n</think>\n\nA2<|im_end|>" in rendered


def test_llama3_fixture_tools_in_first_user_message_and_ipython_results():
    tokenizer = fixture_tokenizer("llama3")
    messages = conversation()
    messages[3]["content"] = {"temp": 22}
    rendered = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert rendered.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
    user = rendered.index("<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions")
    assert user < rendered.index('"name": "get_weather"') < rendered.index("Weather in Zürich?<|eot_id|>")
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n{"temp": 22}<|eot_id|>' in rendered
    with pytest.raises(TemplateError, match="single tool-calls"):
        tokenizer.apply_chat_template(conversation(calls=2), tools=TOOLS, tokenize=False)


def test_mistral_fixture_tools_before_last_user_message_and_call_ids():
    tokenizer = fixture_tokenizer("mistral")
    first = [{"role": "user", "content": "Q1"}]
    second = first + [{"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]
    one = tokenizer.apply_chat_template(first, tools=TOOLS, tokenize=False)
    two = tokenizer.apply_chat_template(second, tools=TOOLS, tokenize=False)
    assert one.startswith("<s>[AVAILABLE_TOOLS] [") and one.endswith("[/AVAILABLE_TOOLS][INST] Q1[/INST]")
    assert two.startswith("<s>[INST] Q1[/INST] A1</s>[AVAILABLE_TOOLS] [") and two.endswith("[INST] Q2[/INST]")
    assert not two.startswith(one)  # not append-only across user turns, like the real template
    rendered = tokenizer.apply_chat_template(conversation(), tools=TOOLS, tokenize=False)
    assert '[TOOL_RESULTS] {"content": "result 0", "call_id": "abc123XY0"}[/TOOL_RESULTS]' in rendered
    for bad_id in ("short", "abc-23XYZ"):
        messages = conversation()
        messages[2]["tool_calls"][0]["id"] = bad_id
        with pytest.raises(TemplateError, match="length 9"):
            tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
