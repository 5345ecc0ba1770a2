"""The real chat templates of the model families textenv knows (tests/fixtures/chat_templates/real/, sources and
licences in its README): `textenv.chat.families` knows each one byte for byte and by its markers, each renders a
tool conversation as recorded here (or raises on the message kind recorded here), and `check_conformance`'s
turn-by-turn verdict on each is the one the README's table states."""

from __future__ import annotations

import functools
import json

import pytest

from chat_fixtures import FIXTURE_TEMPLATES, REAL_TEMPLATES, fixture_template, real_template, real_template_tokenizer
from textenv.chat import FAMILIES, ChatRenderer, Family, check_conformance, recognise_family
from textenv.chat.conformance import SAMPLE_CONVERSATION
from textenv.chat.families import FAMILIES_BY_NAME, template_sha256
from textenv.chat.template_hashes import KNOWN_TEMPLATES
from textenv.chat.transcript import rendering_pieces, turns_of

FAMILY_OF = {template: FAMILIES_BY_NAME[family] for template, family in KNOWN_TEMPLATES.values()}
PARSERS = {"hermes", "llama3", "mistral", "qwen3_coder", "glm4", "gpt_oss", "deepseek_v3", "deepseek_v31", "pythonic", "phi4_mini", "gemma4"}
SCHEMAS = [{"type": "function", "function": {"name": "Calculator", "description": "Evaluate an arithmetic expression.",
                                             "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]
KINDS = ("user", "tool call", "tool result", "reply", "second user", "last reply")

# Per template: the message kind rendering raises on (the conversation up to it), or None, and what the rendering of
# the whole conversation leaves out: the tool list (tools=), the call, the result, the last reply's thinking (thinking
# families only).
RENDERED = {
    "deepseek_r1_distill": (None, ("tools", "tool call", "thinking")),
    "deepseek_r1_distill_training": (None, ("tools", "tool call")),
    "deepseekv3": ("tool call", ()),  # arguments must be a JSON string: `str + dict` raises TypeError
    "deepseekv3_training": (None, ("tools", "thinking")),
    "gemma3": ("tool result", ()),  # "Conversation roles must alternate user/assistant/..."
    "gemma3_training": ("tool result", ()),
    "gemma4": (None, ("thinking",)),
    "gemma4_v5": (None, ()),
    "glm4moe": (None, ()),
    "glm4moe_training": (None, ()),
    "gptoss": (None, ()),
    "gptoss_training": (None, ()),
    "lfm2": (None, ("tool call",)),
    "lfm2_2_5": (None, ()),
    "lfm2_training": (None, ("tool call",)),
    "lfm2_v2": (None, ()),
    "lfm2_v2_training": (None, ()),
    "llama3_1": (None, ()),
    "llama3_2": (None, ()),
    "mistral_v13_tekken": (None, ()),
    "mistral_v7_tekken": (None, ()),
    "nemotron_3_nano": (None, ()),
    "nemotron_3_nano_training": (None, ()),
    "phi3_5": (None, ("tools", "tool call", "tool result")),
    "phi3_5_training": (None, ("tools", "tool call", "tool result")),
    "phi4_mini": (None, ("tools", "tool call")),
    "qwen2_5": (None, ()),
    "qwen2_5_training": (None, ()),
    "qwen3": (None, ()),
    "qwen3_training": (None, ()),
    "qwen3_5_nothink": (None, ()),
    "qwen3_5_nothink_training": (None, ()),
    "qwen3_5_think": (None, ()),
    "qwen3_5_think_training": (None, ()),
}

# Per template: check_conformance's SAMPLE_CONVERSATION (with the tool schema) turn by turn; () is append-only.
ALL_RAISE_FROM_4 = ("4 tool: raised", "5 assistant: raised", "6 tool: raised", "7 assistant: raised", "8 user: raised",
                    "9 assistant: raised", "10 user: raised")
PHI_END = ("3 assistant: rewrote", "5 assistant: rewrote", "7 assistant: rewrote", "8 user: rewrote",
           "9 assistant: rewrote", "10 user: rewrote")
CONFORMANCE = {
    "deepseek_r1_distill": (),
    "deepseek_r1_distill_training": (),
    "deepseekv3": ("5 assistant: rewrote",),  # ChatRenderer passes the arguments as JSON after its refusal; then as with them
    "deepseekv3_training": ("5 assistant: rewrote",),
    "gemma3": ALL_RAISE_FROM_4,
    "gemma3_training": ALL_RAISE_FROM_4,
    "gemma4": (),
    "gemma4_v5": (),
    "glm4moe": ("10 user: rewrote",),
    "glm4moe_training": ("10 user: rewrote",),
    "gptoss": ("8 user: rewrote", "10 user: rewrote"),
    "gptoss_training": ("8 user: rewrote", "10 user: rewrote"),
    "lfm2": (),
    "lfm2_2_5": ("10 user: rewrote",),
    "lfm2_training": (),
    "lfm2_v2": (),
    "lfm2_v2_training": (),
    "llama3_1": (),  # a system message alone, with tools, raises: a Transcript renders it with the user message
    "llama3_2": (),
    "mistral_v13_tekken": (),
    "mistral_v7_tekken": ("8 user: rewrote", "10 user: rewrote"),
    "nemotron_3_nano": ("10 user: rewrote",),
    "nemotron_3_nano_training": ("10 user: rewrote",),
    "phi3_5": PHI_END,
    "phi3_5_training": PHI_END,
    "phi4_mini": ("3 assistant: rewrote", "4 tool: rewrote", "5 assistant: rewrote", "6 tool: rewrote",
                  "7 assistant: rewrote", "8 user: rewrote", "9 assistant: rewrote", "10 user: rewrote"),
    "qwen2_5": (),
    "qwen2_5_training": (),
    "qwen3": ("4 tool: rewrote", "6 tool: rewrote", "8 user: rewrote", "10 user: rewrote"),
    "qwen3_training": (),
    "qwen3_5_nothink": ("8 user: rewrote", "10 user: rewrote"),
    "qwen3_5_nothink_training": (),
    "qwen3_5_think": ("8 user: rewrote", "10 user: rewrote"),
    "qwen3_5_think_training": (),
}
# The same conversation in the form a template needs: the thinking in the key the template reads
# (`Family.thinking_key`), or the calls' arguments as a JSON string (DeepSeek's released template).
CONFORMANCE_VARIANTS = {
    ("gemma4", "thinking key"): (),  # the first revision never renders a final reply's thinking
    ("gemma4_v5", "thinking key"): ("10 user: rewrote",),
    ("gptoss", "thinking key"): ("8 user: rewrote", "10 user: rewrote"),
    ("gptoss_training", "thinking key"): ("8 user: rewrote", "10 user: rewrote"),
    ("deepseekv3", "JSON arguments"): ("5 assistant: rewrote",),  # the second call turn joins the first's block
}
# Per template (the others: none): the turns of SAMPLE_CONVERSATION whose text textenv's ChatRenderer.added_text cannot
# give, even after a stand-in ("<length> <role>"; "<length> prompt": the generation prompt after them). A Transcript
# stops at the first, except "1 system": it renders leading system messages with the first user message (`opening_groups`). Recorded so that a change to the renderer, or to these templates, is noticed.
PHI_DELTAS = ("2 user", "2 prompt", "3 assistant", "4 prompt", "5 assistant", "6 prompt", "7 assistant", "8 prompt",
              "9 assistant", "10 prompt")  # eos_token follows the last message, so no render is a prefix of the next
GEMMA3_DELTAS = ("4 tool", "4 prompt", "5 assistant", "6 tool", "6 prompt", "7 assistant", "8 user")
DELTA_FAILURES = {
    "deepseekv3": ("5 assistant",),
    "deepseekv3_training": ("5 assistant",),
    "gemma3": GEMMA3_DELTAS,
    "gemma3_training": GEMMA3_DELTAS,
    "llama3_1": ("1 system",),  # the opening system message alone, with tools, raises
    "llama3_2": ("1 system",),
    "phi3_5": PHI_DELTAS,
    "phi3_5_training": PHI_DELTAS,
    "phi4_mini": PHI_DELTAS,
    **{name: ("1 system", "2 user") for name in ("qwen3_5_think", "qwen3_5_nothink", "qwen3_5_think_training", "qwen3_5_nothink_training")},
}


@functools.lru_cache(maxsize=None)
def tokenizer_for(name: str):
    return real_template_tokenizer(name)


def tool_conversation(family: Family) -> list:
    """System, user, a tool call, its result, a reply, a second user message, and a reply with thinking where the
    family thinks: each with a string no other message holds."""
    call = {"id": "call00001", "type": "function", "function": {"name": "Calculator", "arguments": {"query": "17*23"}}}
    last = {"role": "assistant", "content": "390."}
    if family.thinking and family.thinking_key:
        last[family.thinking_key] = "subtracting one"
    elif family.thinking:
        last["content"] = f"{family.thinking[0]}subtracting one{family.thinking[1]}390."
    return [{"role": "system", "content": "You answer with the calculator."},
            {"role": "user", "content": "What is seventeen times twenty-three?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "391", "tool_call_id": "call00001", "name": "Calculator"},
            {"role": "assistant", "content": "It is three hundred ninety-one."},
            {"role": "user", "content": "And minus one?"}, last]


def conformance_signature(conformance, conversation=SAMPLE_CONVERSATION) -> tuple:
    """The turns that did not extend the render: ``"<length> <roles>: raised|rewrote|tokens"``, where <length> is the
    number of messages rendered (the opening system and user messages render together, as a Transcript renders them)."""
    problems, length = [], 0
    for piece, step in zip(rendering_pieces(conversation), conformance.steps):
        length += len(piece)
        if step.error or not (step.text_appended and step.tokens_appended):
            problems.append(f"{length} {step.role}: " + ("raised" if step.error else "rewrote" if not step.text_appended else "tokens"))
    return tuple(problems)


def test_every_vendored_template_is_known_by_its_hash_and_the_families_cover_the_issue():
    assert set(REAL_TEMPLATES) == set(FAMILY_OF) == set(RENDERED) == set(CONFORMANCE)
    for name in REAL_TEMPLATES:
        assert KNOWN_TEMPLATES[template_sha256(real_template(name))][0] == name
    named = {family.name for family in FAMILY_OF.values()}
    assert {"qwen2_5", "qwen3", "qwen3_5", "llama3", "gemma3", "gpt_oss", "deepseek_r1_distill", "deepseek_v3", "mistral",
            "phi3_5", "glm4_moe", "lfm2", "nemotron_3_nano"} <= named and len(named) >= 13
    assert {"llama3_1", "llama3_2", "qwen3_5_think", "mistral_v7_tekken", "mistral_v13_tekken"} <= set(REAL_TEMPLATES)
    assert {family.name for family in FAMILIES} == named


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
def test_a_family_names_a_known_parser_a_vendored_training_template_and_its_switch(family):
    assert family.parser in PARSERS or (family.parser is None and not family.renders_tool_calls)
    assert family.training_template is None or FAMILY_OF[family.training_template] is family
    assert family.thinking is None or (len(family.thinking) == 2 and all(family.thinking))
    assert family.stop and family.display_name
    templates = [name for name, of in FAMILY_OF.items() if of is family]
    if family.thinking_switch:
        assert all(family.thinking_switch in real_template(name) for name in templates)
    assert not (family.strips_thinking and not family.thinking)


@pytest.mark.parametrize("name", REAL_TEMPLATES)
def test_each_template_is_recognised_exactly_and_by_its_markers_once_edited(name, tokenizer):
    exact = recognise_family(real_template(name), tokenizer.all_special_tokens)
    assert (exact.matched, exact.template, exact.family) == ("exact", name, FAMILY_OF[name])
    edited = recognise_family(real_template(name) + "{#- edited locally #}")
    assert (edited.matched, edited.template, edited.family) == ("markers", None, FAMILY_OF[name]) and edited.markers
    crlf = recognise_family(real_template(name).replace("\r\n", "\n").replace("\n", "\r\n"))
    assert (crlf.matched, crlf.template) == ("exact", name)  # Jinja reads CRLF as LF, and so does the hash


def test_a_crlf_template_renders_as_its_lf_copy():
    crlf = real_template("glm4moe_training")  # shipped with CRLF line endings by TRL
    assert "\r\n" in crlf
    tokenizer = tokenizer_for("glm4moe_training")
    conversation = tool_conversation(FAMILY_OF["glm4moe_training"])
    texts = [tokenizer.apply_chat_template(conversation, tools=SCHEMAS, tokenize=False, chat_template=text)
             for text in (crlf, crlf.replace("\r\n", "\n"))]
    assert texts[0] == texts[1]


def test_unknown_templates_are_not_recognised_and_the_hand_written_fixtures_are_by_markers(tokenizer):
    smollm2 = tokenizer
    assert "<|im_start|>" in smollm2.chat_template and "<tool_call>" not in smollm2.chat_template
    assert recognise_family(smollm2.chat_template, smollm2.all_special_tokens) is None  # plain ChatML: no family
    assert recognise_family(None) is None and recognise_family("") is None
    assert recognise_family("{{ messages[0]['content'] }}", ["<s>", "</s>"]) is None
    expected = {"hermes_qwen": "qwen2_5", "llama3": "llama3", "mistral": "mistral", "qwen3_thinking": "qwen3"}
    for name in FIXTURE_TEMPLATES:
        found = recognise_family(fixture_template(name))
        assert (found.family.name, found.matched) == (expected[name], "markers")


def test_a_tokenizer_without_a_template_is_recognised_by_its_special_tokens():
    found = recognise_family(None, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])
    assert (found.family.name, found.matched, found.source) == ("llama3", "markers", "special tokens")
    found = recognise_family(None, FAMILIES_BY_NAME["gpt_oss"].special_tokens)
    assert found.family.name == "gpt_oss"
    plain = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # a template decides, whatever the tokens
    assert recognise_family(plain, ["<|start_header_id|>"]) is None


def render_outcome(name: str, **switch) -> tuple:
    """(the kind of message rendering first raises on, or None; what the whole conversation's text leaves out)."""
    family, tokenizer = FAMILY_OF[name], tokenizer_for(name)
    conversation, text = tool_conversation(family), ""
    for end in range(2, len(conversation) + 1):
        try:
            text = tokenizer.apply_chat_template(conversation[:end], tools=SCHEMAS, tokenize=False, **switch)
        except Exception:  # noqa: BLE001 - which kind of message a template refuses is the finding
            return KINDS[end - 2], ()
    shown = {"tools": "Evaluate an arithmetic expression." in text, "tool call": "17*23" in text, "tool result": "391" in text,
             "thinking": "subtracting one" in text or not family.thinking}
    assert "You answer with the calculator." in text and "And minus one?" in text
    return None, tuple(part for part, present in shown.items() if not present)


@pytest.mark.parametrize("name", REAL_TEMPLATES)
def test_each_template_renders_a_tool_conversation_as_recorded(name):
    family = FAMILY_OF[name]
    switches = [{}] + ([{family.thinking_switch: True}, {family.thinking_switch: False}] if family.thinking_switch else [])
    for switch in switches:
        assert render_outcome(name, **switch) == RENDERED[name], switch


def transformers_drops_none_keys() -> bool:
    """Whether `apply_chat_template` drops a message's None-valued keys before rendering (transformers 5.24 does,
    5.16.1 does not)."""
    tokenizer = tokenizer_for("qwen2_5")
    probe = "{{ 'content' in messages[0] }}"
    return tokenizer.apply_chat_template([{"role": "user", "content": None}], tokenize=False, chat_template=probe) == "False"


@pytest.mark.parametrize("name", ["deepseekv3", "deepseek_r1_distill"])
def test_deepseek_templates_render_a_call_only_with_json_arguments_and_content_none_kept(name):
    call = {"type": "function", "function": {"name": "Calculator", "arguments": json.dumps({"query": "17*23"})}}
    rendered = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>Calculator\n```json\n{"query": "17*23"}\n```'
                "<｜tool▁call▁end｜>")  # R1-Distill never closes a single call with <｜tool▁calls▁end｜>
    question = {"role": "user", "content": "What is seventeen times twenty-three?"}
    with_text = tokenizer_for(name).apply_chat_template([question, {"role": "assistant", "content": "", "tool_calls": [call]}],
                                                        tokenize=False)
    assert (rendered in with_text) == (name == "deepseekv3")  # R1-Distill drops a call that comes with content
    without = [question, {"role": "assistant", "content": None, "tool_calls": [call]}]
    if transformers_drops_none_keys():  # content=None arrives as a missing key: `'<｜Assistant｜>' + undefined` raises
        with pytest.raises(Exception, match="has no attribute 'content'"):
            tokenizer_for(name).apply_chat_template(without, tokenize=False)
    else:
        assert rendered in tokenizer_for(name).apply_chat_template(without, tokenize=False)


@pytest.mark.parametrize("name", REAL_TEMPLATES)
def test_check_conformance_of_each_template_is_as_recorded(name):
    conformance = check_conformance(ChatRenderer(tokenizer_for(name), tools=SCHEMAS))
    assert conformance_signature(conformance) == CONFORMANCE[name]
    assert conformance.append_only == (CONFORMANCE[name] == ())


def variant_conversation(name: str, variant: str) -> list:
    """SAMPLE_CONVERSATION with the thinking reply's thinking in the family's key, or the calls' arguments as JSON."""
    conversation = [dict(message) for message in SAMPLE_CONVERSATION]
    if variant == "thinking key":
        conversation[8] = {"role": "assistant", "content": "5.", FAMILY_OF[name].thinking_key: "6-1 is 5."}
        return conversation
    for message in conversation:
        if message.get("tool_calls"):
            message["tool_calls"] = [{**call, "function": {**call["function"], "arguments": json.dumps(call["function"]["arguments"])}}
                                     for call in message["tool_calls"]]
    return conversation


@pytest.mark.parametrize("name, variant", sorted(CONFORMANCE_VARIANTS))
def test_check_conformance_of_the_conversation_in_the_form_a_template_needs(name, variant):
    conformance = check_conformance(ChatRenderer(tokenizer_for(name), tools=SCHEMAS), variant_conversation(name, variant))
    assert conformance_signature(conformance, variant_conversation(name, variant)) == CONFORMANCE_VARIANTS[(name, variant)]


def test_a_familys_rewrite_flag_agrees_with_its_released_templates():
    released = {name for name in REAL_TEMPLATES if "_training" not in name}
    variants: dict = {}
    for (name, _), problems in CONFORMANCE_VARIANTS.items():
        variants[name] = variants.get(name, ()) + problems
    for family in FAMILIES:
        rewrote = [name for name in released if FAMILY_OF[name] is family
                   and any(problem.endswith("rewrote") for problem in CONFORMANCE[name] + variants.get(name, ()))]
        assert bool(rewrote) == family.rewrites_history, family.name


@pytest.mark.parametrize("name", REAL_TEMPLATES)
def test_the_turns_textenv_cannot_render_a_delta_for_are_as_recorded(name):
    renderer, failures, length = ChatRenderer(tokenizer_for(name), tools=SCHEMAS), [], 0
    for turn in turns_of(SAMPLE_CONVERSATION):
        before, length = SAMPLE_CONVERSATION[:length], length + len(turn)
        try:
            renderer.added_text(before, list(turn))
        except Exception:  # noqa: BLE001 - ChatTemplateError, or the template's own error on the opening message
            failures.append(f"{length} {turn[0]['role']}")
        if turn[0]["role"] != "assistant" and length > 1:
            try:
                renderer.generation_prompt(SAMPLE_CONVERSATION[:length])
            except Exception:  # noqa: BLE001
                failures.append(f"{length} prompt")
    assert tuple(failures) == DELTA_FAILURES.get(name, ())
