"""textenv's tool-call parsers against the libraries, on the same text.

transformers' `parse_response` with TRL's response templates must read the same calls (names and arguments) and the
same reasoning as textenv's parser for that format, on turns the family's own template writes and on model-style
turns (thinking first). And every chat template TRL ships must be read by the parser `parser_for_template` picks for
it: the tool-call turn the template renders reads back as the calls it was given. TRL's templates and response
templates live in `trl.chat_template_utils` (TRL 1.x); the module skips, saying so, where that is missing (TRL 0.23
in .venv-lower), and a comparison skips where the installed TRL lacks its response template.
"""

import copy
import functools
import json

import pytest
from chat_fixtures import _bundled_tokenizer
from jinja2.exceptions import TemplateError

from textenv.tools.tool_call_parsers import TOOL_CALL_PARSERS, parser_for_template

trl_templates = pytest.importorskip("trl.chat_template_utils", reason="this TRL has no trl.chat_template_utils (TRL 0.23 ships no chat "
                                    "templates nor response templates), so there is nothing to compare with")
TEMPLATE_DIR = __import__("pathlib").Path(trl_templates.__file__).parent / "chat_templates"
TEMPLATE_NAMES = sorted(path.stem for path in TEMPLATE_DIR.glob("*.jinja"))

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {
             "city": {"type": "string"}, "days": {"type": "integer"}, "opts": {"type": "object"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "ping", "description": "Ping.", "parameters": {"type": "object", "properties": {}}}}]
ARGUMENTS = {"city": "Zürich", "days": 3, "opts": {"unit": "°C", "list": [1, 2], "note": "«été»"}}
CALLS = [("get_weather", ARGUMENTS), ("ping", {})]
TEXT_CALLS = [("get_weather", {"city": "Zürich", "note": "«été» à 3 h"}), ("ping", {})]  # no value a JSON parse would type
TYPED_BY_SCHEMA = {"qwen3_coder", "glm4"}

# The parser each TRL template calls for (by name prefix, first match); every other template writes no tool calls
# (or a format no parser reads, `UNREAD`), and gets textenv's fallback, "hermes".
EXPECTED_PARSERS = (("qwen3_5", "qwen3_coder"), ("qwen3_6", "qwen3_coder"), ("qwen3_8", "qwen3_coder"), ("nemotron", "qwen3_coder"),
                    ("qwen3_vl", "hermes"), ("qwen3", "hermes"), ("qwen2_5", "hermes"), ("glm4moe", "glm4"), ("gptoss", "gpt_oss"),
                    ("deepseek", "deepseek_v3"), ("gemma4", "gemma4"), ("diffusion_gemma", "gemma4"), ("lfm2", "pythonic"),
                    ("llama3_1", "llama3"), ("llama3_2", "llama3"))
UNREAD = {"muse_glimmer": "Muse Glimmer's ATEM calls (<atem:function_calls><atem:invoke name=...>) have no textenv parser yet"}
WRITES_NO_CALLS = {"lfm2": "LFM2's first template lists the tools (<|tool_list_start|>) but renders no assistant tool_calls",
                   "deepseek_r1_distill": "the R1 distills' template (DeepSeek-V3's markers) drops the tool_calls of a message with content"}


def expected_parser(template_name: str) -> str:
    return next((parser for prefix, parser in EXPECTED_PARSERS if template_name.startswith(prefix)), "hermes")


@functools.lru_cache(maxsize=None)
def tokenizer(template_name: str):
    """A copy of the bundled tokenizer wearing TRL's template `template_name`."""
    copied = copy.deepcopy(_bundled_tokenizer())
    copied.chat_template = (TEMPLATE_DIR / f"{template_name}.jinja").read_text(encoding="utf-8")
    return copied


def generation_prompt(template_name: str) -> str:
    """The prompt a turn is generated after: the question and the template's generation prompt."""
    question = [{"role": "user", "content": "Weather in Zürich?"}]
    return tokenizer(template_name).apply_chat_template(question, tools=TOOLS, tokenize=False, add_generation_prompt=True)


def render_turn(template_name: str, calls) -> str | None:
    """An assistant turn calling `calls` as the template writes it (after the question, and after the generation
    prompt where the template renders the turn append-only); `None` when the template cannot render it. Content
    and no content, arguments as a mapping and as a JSON string are tried, in that order."""
    tok = tokenizer(template_name)
    for content, as_text in ((content, as_text) for content in ("Let me check.", None) for as_text in (False, True)):
        tool_calls = [{"type": "function", "id": f"abc123XY{index}", "function": {
            "name": name, "arguments": json.dumps(arguments, ensure_ascii=False) if as_text else arguments}} for index, (name, arguments) in enumerate(calls)]
        messages = [{"role": "user", "content": "Weather in Zürich?"}, {"role": "assistant", "content": content, "tool_calls": tool_calls}]
        try:
            full = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False)
            before = tok.apply_chat_template(messages[:1], tools=TOOLS, tokenize=False)
        except (TemplateError, TypeError):
            continue
        prompt = generation_prompt(template_name)
        turn = full[len(prompt) :] if full.startswith(prompt) else full[len(before) :]
        if "get_weather" in turn:
            return turn
    return None


def ours(parser: str, text: str, tools=None) -> tuple[list, str]:
    parse = TOOL_CALL_PARSERS[parser]
    turn = parse(text, tools=tools) if parser in TYPED_BY_SCHEMA else parse(text)
    assert all(call.error is None for call in turn.calls), [call.error for call in turn.calls]
    return [(call.name, call.arguments) for call in turn.calls], turn.reasoning


def theirs(template_name: str, response_template: str, text: str, prefix: str, tools=None) -> tuple[list, str]:
    schema = getattr(trl_templates, response_template, None)
    if schema is None:
        pytest.skip(f"this TRL has no trl.chat_template_utils.{response_template}")
    parsed = tokenizer(template_name).parse_response(text, schema, prefix=prefix, tools=tools)
    calls = [(call["function"]["name"], call["function"]["arguments"]) for call in parsed.get("tool_calls") or []]
    return calls, (parsed.get("reasoning_content") or parsed.get("thinking") or "").strip()


# (template the text comes from, response template, textenv parser, model-style turn or None for the rendered one)
COMPARED = {
    "qwen3": ("qwen3", "qwen3_template", "hermes", None),
    "qwen3-thinking": ("qwen3", "qwen3_template", "hermes", '<think>\nThe user wants the weather.\n</think>\n\nSure.\n<tool_call>\n'
                       '{"name": "get_weather", "arguments": {"city": "Zürich", "opts": {"list": [1, 2]}}}\n</tool_call>\n<tool_call>\n'
                       '{"name": "ping", "arguments": {}}\n</tool_call><|im_end|>'),
    "qwen3.5": ("qwen3_5_think", "qwen3_5_template", "qwen3_coder", None),
    "qwen3.5-thinking": ("qwen3_5_think", "qwen3_5_template", "qwen3_coder", "The user wants the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
                         "<parameter=city>\nZürich\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>"),
    "nemotron-3": ("nemotron_3_nano", "nemotron_3_template", "qwen3_coder", "The user wants the weather.\n</think>\n<tool_call>\n<function=get_weather>\n"
                   "<parameter=city>\nZürich\n</parameter>\n<parameter=opts>\n{\"list\": [1, 2]}\n</parameter>\n</function>\n</tool_call>\n"
                   "<tool_call>\n<function=ping>\n</function>\n</tool_call>\n<|im_end|>"),
    "glm4-moe": ("glm4moe", "glm4moe_template", "glm4", None),
    "glm4-moe-thinking": ("glm4moe", "glm4moe_template", "glm4", "<think>The user wants the weather.</think>\nSure.\n<tool_call>get_weather\n"
                          "<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n<arg_key>note</arg_key>\n<arg_value>in °C</arg_value>\n</tool_call>"),
    "llama3.1": ("llama3_1", "llama3_template", "llama3", None),
    "llama3.2": ("llama3_2", "llama3_template", "llama3", None),
    "gpt-oss": ("gptoss", "gptoss_template", "gpt_oss", None),
    "lfm2.5": ("lfm2_2_5", "lfm2_2_5_template", "pythonic", None),
    "lfm2.5-thinking": ("lfm2_2_5", "lfm2_2_5_template", "pythonic", "<think>The user wants the weather.</think>Sure.<|tool_call_start|>"
                        "[get_weather(city='Zürich', days=2, opts={\"k\": [1, \"a\"]}), ping()]<|tool_call_end|><|im_end|>"),
    "gemma4": ("gemma4", "gemma4_template", "gemma4", None),
    "gemma4-thinking": ("gemma4", "gemma4_template", "gemma4", '<|channel>thought\nThe user wants the weather.<channel|><|tool_call>call:get_weather'
                        '{city:<|"|>Zürich<|"|>,opts:{list:[1,2]}}<tool_call|><|tool_call>call:ping{}<tool_call|>'),
    "deepseek-r1-distill": ("deepseek_r1_distill", "deepseek_r1_distill_template", "deepseek_v3", "The user asks 2+2.\n</think>\n\nIt is 4.<｜end▁of▁sentence｜>"),
}


@pytest.mark.parametrize("with_schemas", [False, True], ids=["no-schemas", "schemas"])
@pytest.mark.parametrize("case", sorted(COMPARED))
def test_same_calls_and_reasoning_as_transformers_with_trl_templates(case, with_schemas):
    template_name, response_template, parser, text = COMPARED[case]
    if parser in TYPED_BY_SCHEMA and not with_schemas and not getattr(trl_templates, "_SUPPORTS_PARSE_RESPONSE_TOOLS", True):
        pytest.skip("this transformers (< 5.15) cannot type XML values from schemas: TRL reads them by a lenient JSON parse instead")
    # GLM's own parser reads an untyped value as JSON ("3" -> 3), transformers keeps its text: without schemas, text values
    calls = TEXT_CALLS if parser == "glm4" and not with_schemas else CALLS if parser != "llama3" else CALLS[:1]
    text = render_turn(template_name, calls) if text is None else text
    tools = TOOLS if with_schemas else None
    expected = theirs(template_name, response_template, text, generation_prompt(template_name), tools)
    assert ours(parser, text, tools) == expected
    assert expected[0] or case == "deepseek-r1-distill"  # a comparison of calls, not of two empty lists
    assert expected[1] or not case.endswith(("thinking", "distill"))  # and of reasoning where there is some


@pytest.mark.parametrize("template_name", TEMPLATE_NAMES)
def test_parser_for_every_trl_template(template_name):
    assert parser_for_template(tokenizer(template_name).chat_template) == expected_parser(template_name)


def _unread(name: str):
    reason = next((reason for prefix, reason in UNREAD.items() if name.startswith(prefix)), None)
    return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=reason)) if reason else name


@pytest.mark.parametrize("template_name", [_unread(name) for name in TEMPLATE_NAMES])
def test_every_trl_template_call_reads_back(template_name):
    """The calls a template renders, read by the parser `parser_for_template` picks for it."""
    parser = parser_for_template(tokenizer(template_name).chat_template)
    written = [(calls, turn) for calls in (CALLS, CALLS[:1]) if (turn := render_turn(template_name, calls)) is not None]
    if not written:  # a template that writes no tool call: one for models without tools, or one that only lists them
        assert expected_parser(template_name) == "hermes" or template_name.startswith(tuple(WRITES_NO_CALLS)), template_name
        return
    for calls, turn in written:
        read, _ = ours(parser, turn, TOOLS)
        assert read == (list(calls) if "ping" in turn else list(calls[:1])), turn
