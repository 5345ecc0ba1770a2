"""What is particular to each tool-call format: Mistral's call ids, how the XML-style formats type their values,
harmony's headers, DeepSeek's characters, pythonic calls never evaluated, Phi-4-mini's and Gemma 4's forms."""

import pytest

from textenv.tools.tool_call_parsers import (
    ToolCall,
    parse_deepseek_v3,
    parse_deepseek_v31,
    parse_gemma4,
    parse_glm4,
    parse_gpt_oss,
    parse_hermes,
    parse_llama3,
    parse_mistral,
    parse_phi4_mini,
    parse_pythonic,
    parse_qwen3_coder,
)


def calls_of(turn):
    return [(call.name, call.arguments, call.error) for call in turn.calls]


def tools(**properties):
    return [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": properties}}}]


def test_mistral_call_id_form_and_thinking():
    one = '[TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]{"city": "Paris"}'
    two = "[TOOL_CALLS]ping[CALL_ID]def456UVW[ARGS]{}"
    turn = parse_mistral(f"[THINK]maybe [TOOL_CALLS]decoy[ARGS]{{}}[/THINK]Sure.{one}{two}</s>")
    assert turn.calls == [ToolCall("get_weather", {"city": "Paris"}, one, None, "abc123XYZ"), ToolCall("ping", {}, two, None, "def456UVW")]
    assert turn.reasoning == "maybe [TOOL_CALLS]decoy[ARGS]{}" and turn.content.endswith("Sure.")


def test_qwen3_coder_values_are_strings_without_schemas_as_qwen_reads_them():
    text = "<tool_call>\n<function=f>\n<parameter=zip>\n75001\n</parameter>\n<parameter=n>\nnull\n</parameter>\n</function>\n</tool_call>"
    assert calls_of(parse_qwen3_coder(text)) == [("f", {"zip": "75001", "n": None}, None)]


@pytest.mark.parametrize("schema, raw, value", [
    ({"type": "string"}, "75001", "75001"), ({"type": "integer"}, "75001", 75001), ({"type": "integer"}, "many", "many"),
    ({"type": "number"}, "2.5", 2.5), ({"type": "boolean"}, "True", True), ({"type": "boolean"}, "false", False),
    ({"type": "array"}, '[1, "a"]', [1, "a"]), ({"type": "object"}, "{'k': None}", {"k": None}),
    ({"type": ["integer", "null"]}, "7", 7), ({"anyOf": [{"type": "number"}, {"type": "string"}]}, "x1", "x1"),
    ({"type": "string"}, "null", None), ({}, "3", "3"),
])
def test_qwen3_coder_values_typed_by_the_schema(schema, raw, value):
    text = f"<tool_call>\n<function=f>\n<parameter=a>\n{raw}\n</parameter>\n</function>\n</tool_call>"
    assert calls_of(parse_qwen3_coder(text, tools=tools(a=schema))) == [("f", {"a": value}, None)]


def test_qwen3_coder_keeps_a_values_own_lines_and_reads_its_variants():
    code = "def f(x):\n\n    return x  \n"
    text = f"<tool_call>\n<function=run>\n<parameter=code>\n{code}\n</parameter>\n<parameter=lang>py</parameter>\n</function>\n</tool_call>"
    assert calls_of(parse_qwen3_coder(text)) == [("run", {"code": code, "lang": "py"}, None)]
    lenient = "<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\n2\n</function>\n</tool_call>"  # no </parameter>
    assert calls_of(parse_qwen3_coder(lenient)) == [("f", {"a": "1", "b": "2"}, None)]
    bare = "Sure. <function=f>\n<parameter=a>\nx\n</parameter>\n</function> done"  # no <tool_call>
    assert calls_of(parse_qwen3_coder(bare)) == [("f", {"a": "x"}, None)] and parse_qwen3_coder(bare).content == "Sure.  done"
    hermes = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'  # a Qwen3 JSON call
    assert calls_of(parse_qwen3_coder(hermes)) == [("f", {"a": 1}, None)]
    (cut,) = parse_qwen3_coder("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n").calls
    assert (cut.name, cut.arguments, cut.error) == ("f", None, "the call is cut off: no </function>")


def test_glm4_values_read_as_glm_reads_them():
    text = ("<tool_call>f\n<arg_key>zip</arg_key>\n<arg_value>75001</arg_value>\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
            "<arg_key>flags</arg_key>\n<arg_value>[true, null]</arg_value>\n<arg_key>t</arg_key>\n<arg_value>('a', -1)</arg_value>\n</tool_call>")
    assert calls_of(parse_glm4(text)) == [("f", {"zip": 75001, "city": "Paris", "flags": [True, None], "t": ["a", -1]}, None)]
    assert calls_of(parse_glm4(text, tools=tools(zip={"type": "string"}))) == [("f", {"zip": "75001", "city": "Paris", "flags": [True, None], "t": ["a", -1]}, None)]
    (cut,) = parse_glm4("<tool_call>f\n<arg_key>zip</arg_key>\n<arg_value>75001</arg_value>\n").calls
    assert (cut.name, cut.arguments, cut.error) == ("f", None, "the call is cut off: no </tool_call>")
    (nameless,) = parse_glm4("<tool_call>\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>").calls
    assert (nameless.name, nameless.error) == (None, "the call has no 'name'")


def test_gpt_oss_headers_in_either_order_and_channels():
    template_form = '<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
    model_form = '<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
    for text in (template_form, model_form):
        turn = parse_gpt_oss(text)
        assert (calls_of(turn), turn.reasoning, turn.content) == ([("get_weather", {"city": "Paris"}, None)], "Need weather.", "")
    final = parse_gpt_oss("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.<|return|>")
    assert (final.calls, final.reasoning, final.content) == ([], "Easy.", "It is 4.")
    assert parse_gpt_oss("No harmony here.") == parse_gpt_oss("No harmony here.<|end|>") and parse_gpt_oss("No harmony here.").content == "No harmony here."
    other = parse_gpt_oss('<|channel|>commentary to=browser.search <|constrain|>json<|message|>{"query": "x"}<|call|>')
    assert calls_of(other) == [("browser.search", {"query": "x"}, None)]
    (bad,) = parse_gpt_oss("<|channel|>commentary to=functions.f<|message|>city=Paris<|call|>").calls
    assert bad.name == "f" and bad.error.startswith("malformed JSON")


def test_deepseek_markers_are_fullwidth_bars_and_lower_one_eighth_blocks():
    text = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"a": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    assert calls_of(parse_deepseek_v31(text)) == [("f", {"a": 1}, None)]
    assert {hex(ord(char)) for char in "｜▁"} == {"0xff5c", "0x2581"}
    ascii_lookalike = text.replace("｜", "|").replace("▁", "_")
    assert parse_deepseek_v31(ascii_lookalike).calls == []
    unfenced = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{\"a\": 1}<｜tool▁call▁end｜>"
    assert calls_of(parse_deepseek_v3(unfenced)) == [("f", {"a": 1}, None)]
    (no_separator,) = parse_deepseek_v31("<｜tool▁call▁begin｜>f{}<｜tool▁call▁end｜>").calls
    assert no_separator.error.startswith("expected NAME<｜tool▁sep｜>")


def test_pythonic_values_are_literals_never_evaluated(tmp_path):
    marker = tmp_path / "ran"
    text = f"[f(a=__import__('pathlib').Path({str(marker)!r}).touch())]"
    (call,) = parse_pythonic(text).calls
    assert call.error.startswith("an argument is not a literal value") and not marker.exists()
    for bad, error in [("[f(1)]", "only keyword arguments"), ("[f(**{'a': 1})]", "only keyword arguments"), ("[f(a=x)]", "the name 'x'"),
                       ("[f(a={1, 2})]", "a Set is not a literal"), ("[f(a=1+2)]", "a BinOp is not a literal"), ("[(lambda: 1)()]", "must be a name")]:
        (call,) = parse_pythonic(f"<|tool_call_start|>{bad}<|tool_call_end|>").calls
        assert error in call.error and call.arguments is None, bad


def test_pythonic_literals_and_list_forms():
    text = "[db.query(sql='SELECT 1', limit=-5, pair=(1, 2.5), opts={'k': [None, True, false, null]}), ping()]"
    assert calls_of(parse_pythonic(text)) == [("db.query", {"sql": "SELECT 1", "limit": -5, "pair": [1, 2.5], "opts": {"k": [None, True, False, None]}}, None),
                                              ("ping", {}, None)]
    llama4 = parse_pythonic("<|python_start|>[get_weather(city=\"SF\")]<|python_end|><|eot|>")
    assert calls_of(llama4) == [("get_weather", {"city": "SF"}, None)]
    trailing = parse_pythonic("[f(a=']')] That is all.")
    assert calls_of(trailing) == [("f", {"a": "]"}, None)] and trailing.content == "That is all."
    assert parse_pythonic("[1, 2] are numbers").calls == [] and parse_pythonic("Call f(a=1) later").calls == []


def test_phi4_mini_forms():
    one = parse_phi4_mini('Ok <|tool_call|>{"name": "f", "arguments": {"a": 1}}<|/tool_call|>')
    assert calls_of(one) == [("f", {"a": 1}, None)] and one.content == "Ok"
    functools = parse_phi4_mini('functools[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "parameters": {}}]')
    assert calls_of(functools) == [("f", {"a": 1}, None), ("g", {}, None)]
    openai = parse_phi4_mini('<|tool_call|>[{"type": "function", "function": {"name": "f", "arguments": "{\\"a\\": 2}"}}]<|/tool_call|>')
    assert calls_of(openai) == [("f", {"a": 2}, None)]
    (bad,) = parse_phi4_mini("<|tool_call|>f(a=1)<|/tool_call|>").calls
    assert bad.error == "expected a JSON list of calls after <|tool_call|>"


def test_gemma4_dialect():
    text = '<|tool_call>call:f{<|"|>quoted key<|"|>:1,json:"a \\"b\\"",nothing:None,s:<|"|>x, y: {z}<|"|>,neg:-1.5e2}<tool_call|>'
    assert calls_of(parse_gemma4(text)) == [("f", {"quoted key": 1, "json": 'a "b"', "nothing": None, "s": "x, y: {z}", "neg": -150.0}, None)]
    for bad, error in [("<|tool_call>f{a:1}<tool_call|>", "expected call:NAME{...}"), ("<|tool_call>call:f{a:1} extra<tool_call|>", "unexpected text"),
                       ("<|tool_call>call:f{a:<|\"|>open}<tool_call|>", "malformed arguments: unterminated"), ("<|tool_call>call:f{a:[1,2}}<tool_call|>", "malformed JSON")]:
        (call,) = parse_gemma4(bad).calls
        assert call.error.startswith(error) or error in call.error, (bad, call.error)


def test_llama4_python_block_is_content_and_calls_may_follow_without_separator():
    turn = parse_llama3('<|python_start|>Checking.<|python_end|>{"name": "a", "parameters": {}}{"name": "b", "parameters": {"x": 1}}<|eot|>')
    assert (calls_of(turn), turn.content) == ([("a", {}, None), ("b", {"x": 1}, None)], "Checking.")
    assert parse_llama3("<|python_start|>print(1)<|python_end|>").calls == []


def test_hermes_thinking_opened_by_the_prompt():
    turn = parse_hermes('I might call <tool_call>{"name": "decoy"}</tool_call>\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')
    assert calls_of(turn) == [("f", {}, None)] and turn.reasoning.startswith("I might call")


def test_a_harmony_turn_that_opens_with_its_recipient_is_a_call():
    # After the prompt's `<|start|>assistant`, GPT-OSS's template writes the recipient first: ` to=functions.NAME<|channel|>...`.
    from textenv.tools.tool_call_parsers import get_tool_call_parser

    parsed = get_tool_call_parser("gpt_oss")(' to=functions.Calculator<|channel|>commentary json<|message|>{"query": "2+3"}<|call|>')
    assert [(call.name, call.arguments, call.error) for call in parsed.calls] == [("Calculator", {"query": "2+3"}, None)]
    assert parsed.content == ""
