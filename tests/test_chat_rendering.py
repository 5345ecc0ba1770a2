"""Tool schemas, the shipped tool template, template deltas and the conformance check, on the bundled
tokenizer and the fixture templates (Hermes/Qwen, Llama 3.x, Mistral, a Qwen3-like thinking template)."""

from __future__ import annotations

import warnings
from typing import Optional

import pytest

from chat_fixtures import FIXTURE_TEMPLATES, fixture_tokenizer
from textenv.chat import CHATML_TOOLS_TEMPLATE, ChatRenderer, ChatTools, check_conformance, template_takes_tools, tool_chat_template
from textenv.chat.renderer import stand_in
from textenv.models import load_tokenizer
from textenv.tools import Calculator
from textenv.tools.schema import argument_error, tool_schema


@pytest.fixture(scope="module")
def bundled_tokenizer():
    return load_tokenizer()


def get_weather(city: str, unit: str = "celsius", days: Optional[list[int]] = None) -> str:
    """Get the weather of a city.

    Args:
        city: the city's name,
            for example Paris.
        unit (str): "celsius" or "fahrenheit".
    """
    return f"{city}: sunny"


class SmolagentsStyleTool:
    name = "search"
    description = "Search the web."
    inputs = {"query": {"type": "string", "description": "what to look for"}, "limit": {"type": "integer", "description": "n", "nullable": True}}
    output_type = "string"

    def forward(self, query, limit=None):
        return query

    def __call__(self, **kwargs):
        return self.forward(**kwargs)


def test_schema_from_signature_and_docstring():
    schema = tool_schema("get_weather", get_weather)
    function = schema["function"]
    assert schema["type"] == "function" and function["name"] == "get_weather"
    assert function["description"] == "Get the weather of a city."
    parameters = function["parameters"]
    assert parameters["required"] == ["city"]
    assert parameters["properties"]["city"] == {"type": "string", "description": "the city's name, for example Paris."}
    assert parameters["properties"]["unit"]["description"] == '"celsius" or "fahrenheit".'
    assert parameters["properties"]["days"] == {"type": "array", "items": {"type": "integer"}, "nullable": True}


def test_schema_of_callable_object_smolagents_tool_and_given_schema():
    calculator = tool_schema("Calculator", Calculator())["function"]
    assert calculator["parameters"]["required"] == ["query"]
    assert calculator["description"].startswith("Evaluate an arithmetic expression")
    assert "13-3" in calculator["parameters"]["properties"]["query"]["description"]
    search = tool_schema("search", SmolagentsStyleTool())["function"]
    assert search["description"] == "Search the web." and search["parameters"]["required"] == ["query"]
    assert search["parameters"]["properties"]["limit"]["type"] == "integer"

    class Given:
        json_schema = {"name": "ignored", "description": "mine", "parameters": {"type": "object", "properties": {}}}

        def __call__(self):
            return "x"

    assert tool_schema("given", Given())["function"] == {"name": "given", "description": "mine", "parameters": {"type": "object", "properties": {}}}


def test_argument_errors_name_missing_and_unexpected_arguments():
    assert argument_error(get_weather, {"city": "Paris"}) is None
    message = argument_error(get_weather, {"town": "Paris"})
    assert "missing 'city'" in message and "unexpected 'town'" in message and "city, unit, days" in message
    assert argument_error(Calculator(), {"expression": "1+1"}).startswith("missing 'query'; unexpected 'expression'")
    assert argument_error(SmolagentsStyleTool(), {"query": "x"}) is None
    assert "missing 'query'" in argument_error(SmolagentsStyleTool(), {"limit": 3})


def test_bundled_template_takes_no_tools_and_gets_the_shipped_one(bundled_tokenizer):
    assert not template_takes_tools(bundled_tokenizer)
    assert tool_chat_template(bundled_tokenizer) == CHATML_TOOLS_TEMPLATE
    assert tool_chat_template(bundled_tokenizer, chat_template="{{ 'x' }}") == "{{ 'x' }}"
    renderer = ChatRenderer(bundled_tokenizer, tools=[tool_schema("Calculator", Calculator())], chat_template=CHATML_TOOLS_TEMPLATE)
    text = renderer.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert '<tools>\n{"type": "function", "function": {"name": "Calculator"' in text
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("name", FIXTURE_TEMPLATES)
def test_fixture_templates_take_tools(name):
    assert template_takes_tools(fixture_tokenizer(name))
    assert tool_chat_template(fixture_tokenizer(name)) is None


def test_a_template_without_tools_that_is_not_chatml_is_refused(bundled_tokenizer):
    import copy

    tokenizer = copy.deepcopy(bundled_tokenizer)
    tokenizer.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ValueError, match="chat_template="):
        tool_chat_template(tokenizer)


# What the conformance check finds per template (the note lists these).
EXPECTED_APPEND_ONLY = {"bundled": True, "hermes_qwen": True, "llama3": True, "mistral": False, "qwen3_thinking": False}


@pytest.mark.parametrize("name", ["bundled", *FIXTURE_TEMPLATES])
def test_conformance_check_per_template(name, bundled_tokenizer):
    tokenizer = bundled_tokenizer if name == "bundled" else fixture_tokenizer(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chat = ChatTools(tokenizer)
    conformance = chat.conformance
    assert conformance.append_only is EXPECTED_APPEND_ONLY[name], conformance.summary()
    assert len(conformance.steps) == 9  # the opening system and user messages render together, then 8 turns
    warned = [str(warning.message) for warning in caught if "append-only" in str(warning.message)]
    if EXPECTED_APPEND_ONLY[name]:
        assert not warned and conformance.summary().startswith("append-only")
    else:
        assert warned and "not append-only" in warned[0]
    if name == "mistral":  # the tool list moves to the last user message
        assert [step.role for step in conformance.steps if not step.text_appended] == ["user", "user"]
    if name == "qwen3_thinking":  # the last reply's think block goes once it is not the last message
        assert [index for index, step in enumerate(conformance.steps, 1) if not step.text_appended] == [3, 5, 7, 9]


def test_conformance_catches_a_token_boundary_change(bundled_tokenizer):
    # The text grows by appending, but "hel" + "lo" tokenizes as one token, not the ids of "hel" and more.
    renderer = ChatRenderer(bundled_tokenizer, chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    conversation = [{"role": "user", "content": "hel"}, {"role": "assistant", "content": "lo"}]
    steps = check_conformance(renderer, conversation).steps
    assert steps[1].text_appended and not steps[1].tokens_appended


def _calls(*queries):
    return [{"id": f"call0000{i}", "type": "function", "function": {"name": "Calculator", "arguments": {"query": q}}} for i, q in enumerate(queries, 1)]


@pytest.mark.parametrize("name", FIXTURE_TEMPLATES)
def test_tool_results_delta_is_what_the_template_renders_after_the_reply(name):
    tokenizer = fixture_tokenizer(name)
    renderer = ChatRenderer(tokenizer, tools=[tool_schema("Calculator", Calculator())])
    calls = _calls("2+3") if name == "llama3" else _calls("2+3", "4*5")
    before = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sums?"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    results = [{"role": "tool", "content": str(5 + 15 * i), "tool_call_id": call["id"], "name": "Calculator"} for i, call in enumerate(calls)]
    delta = renderer.added_text(before, results, add_generation_prompt=True)
    full = renderer.render([*before, *results], add_generation_prompt=True)
    assert full.endswith(delta) and "5" in delta
    closing = renderer.assistant_suffix(before[:-1])
    # The delta starts right after the reply's closing text in the full rendering.
    assert full[: len(full) - len(delta)].endswith(closing)


def test_qwen3_thinking_delta_keeps_the_sampled_reply_and_adds_the_results():
    renderer = ChatRenderer(fixture_tokenizer("qwen3_thinking"), tools=[tool_schema("Calculator", Calculator())])
    # A reply without reasoning gets an empty think block only while it is the last message.
    before = [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "", "tool_calls": _calls("2+3")}]
    result = [{"role": "tool", "content": "5", "tool_call_id": "call00001", "name": "Calculator"}]
    assert not renderer.render([*before, *result]).startswith(renderer.render(before))  # not append-only here
    delta = renderer.added_text(before, result, add_generation_prompt=True)
    assert delta == "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert renderer.deltas_used == {"after the reply": 1}


def test_mistral_delta_puts_the_tools_before_a_new_user_message():
    renderer = ChatRenderer(fixture_tokenizer("mistral"), tools=[tool_schema("Calculator", Calculator())])
    before = [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}]
    delta = renderer.added_text(before, [{"role": "user", "content": "and 4*5?"}])
    assert delta.startswith("[AVAILABLE_TOOLS]") and delta.endswith("[INST] and 4*5?[/INST]")


def test_stand_in_keeps_system_and_the_last_user_turn():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "<think>x</think>a2", "tool_calls": _calls("1", "2")},
    ]
    short = stand_in(messages, max_calls=1)
    assert [message["role"] for message in short] == ["system", "user", "assistant"]
    assert short[1]["content"] == "u2" and "think" not in short[2]["content"] and len(short[2]["tool_calls"]) == 1
    assert len(messages[4]["tool_calls"]) == 2  # the real conversation is not modified


def test_the_render_cache_gives_what_the_template_renders_for_the_messages_as_they_are_now(bundled_tokenizer, monkeypatch):
    from textenv.chat import renderer as renderer_module

    renderer = ChatRenderer(bundled_tokenizer, chat_template=CHATML_TOOLS_TEMPLATE).with_tools([tool_schema("Calculator", Calculator())])
    conversation = [{"role": "user", "content": "What is 17+25?"}]
    first = renderer.render(conversation, add_generation_prompt=True)
    assert renderer.render(conversation, add_generation_prompt=True) is first  # kept
    conversation[0]["content"] = "What is 4*5?"  # the same list, changed: a new render
    changed = renderer.render(conversation, add_generation_prompt=True)
    assert "4*5" in changed and "17+25" not in changed
    assert renderer.render(conversation, tools=None) == bundled_tokenizer.apply_chat_template(
        conversation, tokenize=False, chat_template=CHATML_TOOLS_TEMPLATE)  # without tools: not the tools' render
    not_json = [{"role": "user", "content": "What is 6*7?", "attachment": object()}]
    assert renderer.render(not_json) == renderer.render(not_json) and len(renderer._rendered) == 3  # rendered, not kept
    monkeypatch.setattr(renderer_module, "RENDER_CACHE_SIZE", 2)
    for question in ("a", "b", "c"):
        renderer.render([{"role": "user", "content": question}])
    assert len(renderer._rendered) == 2
