"""Model families: what textenv needs to know about a chat template it did not write, and how to recognise one.

A `Family` is one way of writing conversations: its tool-call format (the name of the parser in
`textenv.tools` that reads it), its thinking markers, the strings a turn ends with, the control tokens its
template uses, whether its released template rewrites earlier turns, and the prefix-preserving training
template TRL ships for it. `FAMILIES` lists them.

`recognise_family` tells a tokenizer's family from its chat template: first by identity (the sha256 of a known
template, `textenv.chat.template_hashes`; the templates themselves are vendored with their sources in
``tests/fixtures/chat_templates/real/``), then by distinctive markers in the template text (a locally edited
template); a tokenizer without a template, by its special tokens.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple

from textenv.chat.template_hashes import KNOWN_TEMPLATES

EXACT, MARKERS = "exact", "markers"
_NEWLINES = re.compile(r"\r\n|\r")
THINK = ("<think>", "</think>")
CHATML = ("<|im_start|>", "<|im_end|>")
DEEPSEEK_TOKENS = (
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
)
LFM2_TOKENS = ("<|startoftext|>", *CHATML, "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>",
               "<|tool_call_end|>", "<|tool_response_start|>", "<|tool_response_end|>")
QWEN3_TOKENS = (*CHATML, "<tool_call>", "</tool_call>", *THINK, "<tool_response>", "</tool_response>")
PHI_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>")
# What several families share: ChatML thinking models whose released template drops earlier thinking, DeepSeek's
# tokens and thinking, Phi's turns.
QWEN_THINKING = dict(thinking=THINK, thinking_switch="enable_thinking", stop=("<|im_end|>",), special_tokens=QWEN3_TOKENS,
                     rewrites_history=True, strips_thinking=True)
DEEPSEEK = dict(parser="deepseek_v3", thinking=THINK, stop=("<｜end▁of▁sentence｜>",), special_tokens=DEEPSEEK_TOKENS,
                bos_token="<｜begin▁of▁sentence｜>", strips_thinking=True)
PHI = dict(stop=("<|end|>", "<|endoftext|>"), rewrites_history=True, renders_tool_calls=False)


@dataclass(frozen=True)
class Family:
    """One model family's conversation conventions.

    Args:
        name (`str`): registry key (``"qwen3"``).
        display_name (`str`): for people (``"Qwen3"``).
        parser (`str`, *optional*): the `textenv.tools` tool-call parser that reads the calls its models write;
            `None` when its template teaches no tool-call format.
        thinking (`tuple[str, str]`, *optional*): the markers that open and close a reply's thinking.
        thinking_switch (`str`, *optional*): the template keyword that turns thinking on and off
            (``"enable_thinking"``).
        thinking_key (`str`, *optional*): the message key the template reads an assistant's thinking from when
            it does not take it inline in ``content`` (``"thinking"`` for GPT-OSS).
        stop (`tuple[str, ...]`): the tokens a model turn ends with, after a reply or after a tool call (the eos ids
            of its released generation config: Gemma 4 stops a call turn at ``<|tool_response>``).
        special_tokens (`tuple[str, ...]`): the control tokens its template writes.
        bos_token (`str`, *optional*): the beginning-of-sequence token its template writes as ``bos_token``.
        rewrites_history (`bool`): its current released template renders earlier turns differently once later
            turns follow (strips thinking, moves the tool list, closes the last reply differently); textenv then
            renders deltas after a stand-in.
        strips_thinking (`bool`): its released template leaves out the thinking of earlier replies (some leave
            out every reply's thinking, which is lossy but append-only).
        renders_tool_calls (`bool`): its released template writes an assistant message's ``tool_calls``.
        training_template (`str`, *optional*): the prefix-preserving template TRL ships for it
            (``trl/chat_templates/<name>.jinja``).
        notes (`str`): what else is worth knowing.
    """

    name: str
    display_name: str
    parser: Optional[str]
    thinking: Optional[Tuple[str, str]] = None
    thinking_switch: Optional[str] = None
    thinking_key: Optional[str] = None
    stop: Tuple[str, ...] = ()
    special_tokens: Tuple[str, ...] = ()
    bos_token: Optional[str] = None
    rewrites_history: bool = False
    strips_thinking: bool = False
    renders_tool_calls: bool = True
    training_template: Optional[str] = None
    notes: str = ""


FAMILIES: Tuple[Family, ...] = (
    Family("qwen2_5", "Qwen2.5 (Hermes tool calls)", "hermes", stop=("<|im_end|>",),
           special_tokens=(*CHATML, "<tool_call>", "</tool_call>"), training_template="qwen2_5_training",
           notes="Consecutive tool results share one user turn as <tool_response> blocks; Hermes 2/3 and "
                 "Qwen3-Instruct-2507 write the same format."),
    Family("qwen3", "Qwen3", "hermes", **QWEN_THINKING, training_template="qwen3_training",
           notes="Thinking before the last user message is dropped, and the last reply's empty think block "
                 "disappears once a tool result follows; enable_thinking=False prefills an empty think block."),
    Family("qwen3_5", "Qwen3.5", "qwen3_coder", **QWEN_THINKING, training_template="qwen3_5_think_training",
           notes="Calls as <tool_call><function=name><parameter=key>value</parameter></function></tool_call> "
                 "(the Qwen3-Coder format); a conversation without a user message raises; the 2B-and-smaller "
                 "models' template defaults to enable_thinking=False (qwen3_5_nothink_training)."),
    Family("nemotron_3_nano", "Nemotron 3 Nano", "qwen3_coder", **QWEN_THINKING, training_template="nemotron_3_nano_training",
           notes="The Qwen3-Coder call format; truncate_history_thinking (default on) drops earlier thinking."),
    Family("llama3", "Llama 3.1 / 3.2", "llama3", stop=("<|eot_id|>", "<|eom_id|>"),
           special_tokens=("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                           "<|eom_id|>", "<|python_tag|>"),
           bos_token="<|begin_of_text|>",
           notes="One call per assistant turn (more raise), as {\"name\", \"parameters\"}; results as role ipython; "
                 "tools go in the first user message (a system message alone with tools raises); the system "
                 "turn carries today's date. TRL's llama3_training is for Llama 3.0's template."),
    Family("gemma3", "Gemma 3", None, stop=("<end_of_turn>",), special_tokens=("<bos>", "<start_of_turn>", "<end_of_turn>"),
           bos_token="<bos>", renders_tool_calls=False, training_template="gemma3_training",
           notes="No tools: roles must alternate user/model, so a tool message raises; tools= and tool_calls are "
                 "ignored (vLLM serves it with its own pythonic tool template)."),
    Family("gemma4", "Gemma 4", "gemma4", ("<|channel>thought\n", "<channel|>"), "enable_thinking", "reasoning",
           stop=("<turn|>", "<|tool_response>"),
           special_tokens=("<bos>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>", "<|tool>",
                           "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>'),
           bos_token="<bos>", rewrites_history=True, strips_thinking=True,
           notes="Calls as <|tool_call>call:name{key:<|\"|>value<|\"|>}<tool_call|>, results inside the model turn; "
                 "thinking is read from `reasoning` (or reasoning_content) and inline thinking is stripped; the "
                 "current revision keeps the last reply's thinking until a user message follows."),
    Family("gpt_oss", "GPT-OSS (harmony)", "gpt_oss", ("<|channel|>analysis<|message|>", "<|end|>"),
           thinking_key="thinking", stop=("<|return|>", "<|call|>", "<|end|>"),
           special_tokens=("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
                           "<|call|>", "<|startoftext|>", "<|endoftext|>"),
           rewrites_history=True, strips_thinking=True, training_template="gptoss_training",
           notes="Thinking goes in the `thinking` key (the analysis channel) and is dropped once a final answer "
                 "follows; the last reply ends with <|return|>, which becomes <|end|> once a user message follows; "
                 "calls end with <|call|>."),
    Family("deepseek_r1_distill", "DeepSeek-R1-Distill", **DEEPSEEK, renders_tool_calls=False,
           training_template="deepseek_r1_distill_training",
           notes="Every reply loses everything up to </think> (lossy but append-only); tools= is ignored; "
                 "tool_calls are rendered only when content is None (which transformers 5.24 drops, so it raises), "
                 "with arguments as a JSON string, and a single call is never closed."),
    Family("deepseek_v3", "DeepSeek-V3 / R1", **DEEPSEEK, rewrites_history=True, training_template="deepseekv3_training",
           notes="Calls as <｜tool▁call▁begin｜>function<｜tool▁sep｜>name + a ```json block; tools= is ignored; "
                 "arguments must be a JSON string (a mapping raises; TRL's training template takes one); a second "
                 "tool-call turn is merged into the first's block; the generation prompt opens <think>."),
    Family("mistral", "Mistral (Tekken tokenizers)", "mistral", stop=("</s>",),
           special_tokens=("<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CALLS]",
                           "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
                           "[TOOL_CONTENT]", "[ARGS]", "[CALL_ID]"),
           bos_token="<s>", rewrites_history=True,
           notes="v7 (Mistral Small 3.x): [TOOL_CALLS][{name, arguments, id}] with the tool list before the LAST "
                 "user message (rewrites); v13: [TOOL_CALLS]name[ARGS]{...} with the tool list before the first "
                 "(append-only); v7 call ids must be 9 characters; no generation prompt."),
    Family("phi3_5", "Phi-3.5", None, **PHI, special_tokens=PHI_TOKENS, training_template="phi3_5_training",
           notes="No tools: tool messages and tool_calls are silently dropped; eos_token follows the last message "
                 "unless add_generation_prompt, so every added turn rewrites the end."),
    Family("phi4_mini", "Phi-4-mini", "phi4_mini", **PHI,
           special_tokens=(*PHI_TOKENS, "<|tool|>", "<|/tool|>", "<|tool_call|>", "<|/tool_call|>"),
           notes="Tools go in the system message's `tools` key (a JSON string), not tools=; tool_calls are not "
                 "rendered (the model writes <|tool_call|>[...]<|/tool_call|> in content); eos_token follows the "
                 "last message unless add_generation_prompt, as Phi-3.5's."),
    Family("glm4_moe", "GLM-4.5 / 4.6", "glm4", THINK, "enable_thinking", stop=("<|user|>", "<|observation|>", "<|endoftext|>"),
           special_tokens=("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", *THINK,
                           "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
                           "<tool_response>", "</tool_response>", "<|endoftext|>"),
           rewrites_history=True, strips_thinking=True, training_template="glm4moe_training",
           notes="Calls as <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>; a turn ends "
                 "where the next role token starts; earlier thinking becomes an empty <think></think>."),
    Family("lfm2", "LFM2", "pythonic", stop=("<|im_end|>",), special_tokens=LFM2_TOKENS, bos_token="<|startoftext|>",
           training_template="lfm2_v2_training",
           notes="Calls as <|tool_call_start|>[name(key='value')]<|tool_call_end|>; the first LFM2 template drops "
                 "tool_calls (the model wrote them in content), lfm2_v2 renders them."),
    Family("lfm2_5", "LFM2.5", "pythonic", THINK, stop=("<|im_end|>",), special_tokens=(*LFM2_TOKENS, *THINK),
           bos_token="<|startoftext|>", rewrites_history=True, strips_thinking=True,
           notes="LFM2's call format; thinking (inline, or the `thinking` key) is dropped before the last user message "
                 "unless preserve_thinking; the template carries {% generation %} markers, so TRL ships no training one."),
)
FAMILIES_BY_NAME: Dict[str, Family] = {family.name: family for family in FAMILIES}

# Ordered: the first rule whose markers all occur wins, so more specific rules come first.
MARKER_RULES: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("gpt_oss", ("<|channel|>", "<|message|>")),
    ("gemma4", ("<|turn>",)),
    ("gemma4", ("<|tool_call>",)),
    ("gemma3", ("<start_of_turn>",)),
    ("deepseek_v3", ("<｜Assistant｜>", "is_first_sp")),
    ("deepseek_r1_distill", ("<｜Assistant｜>",)),
    ("glm4_moe", ("<arg_key>",)),
    ("glm4_moe", ("[gMASK]",)),
    ("lfm2_5", ("<|tool_call_start|>", "<think>")),
    ("lfm2", ("<|tool_call_start|>",)),
    ("lfm2", ("<|tool_list_start|>",)),
    ("lfm2", ("<|tool_response_start|>",)),
    ("nemotron_3_nano", ("<function=", "truncate_history_thinking")),
    ("qwen3_5", ("<function=",)),
    ("qwen3", ("<|im_start|>", "<tool_call>", "<think>")),
    ("qwen2_5", ("<|im_start|>", "<tool_call>")),
    ("llama3", ("<|start_header_id|>",)),
    ("mistral", ("[INST]",)),
    ("mistral", ("[TOOL_CALLS]",)),
    ("phi4_mini", ("<|assistant|>", "<|tool|>")),
    ("phi3_5", ("<|assistant|>", "<|end|>")),
)


@dataclass(frozen=True)
class Recognition:
    """How `recognise_family` recognised a template.

    Args:
        family (`Family`): the family.
        matched (`str`): ``"exact"`` (the template is a known one, byte for byte) or ``"markers"``.
        template (`str`, *optional*): on an exact match, the known template's name
            (``tests/fixtures/chat_templates/real/<template>.jinja``).
        markers (`tuple[str, ...]`): on a marker match, the markers found.
        source (`str`): ``"template"``, or ``"special tokens"`` when only the tokenizer's special tokens matched.
    """

    family: Family
    matched: str
    template: Optional[str] = None
    markers: Tuple[str, ...] = ()
    source: str = "template"


def template_sha256(chat_template: str) -> str:
    """The sha256 hex digest of a chat template's UTF-8 text, as `KNOWN_TEMPLATES` keys it: line endings are
    made ``\\n`` first, as Jinja does when it reads a template (so a CRLF copy renders, and hashes, the same)."""
    return hashlib.sha256(_NEWLINES.sub("\n", chat_template).encode("utf-8")).hexdigest()


def recognise_family(chat_template: Optional[str], special_tokens: Iterable[str] = ()) -> Optional[Recognition]:
    """The family a tokenizer's chat template belongs to.

    Args:
        chat_template (`str`, *optional*): the Jinja template (``tokenizer.chat_template``).
        special_tokens (`Iterable[str]`): the tokenizer's special tokens (``tokenizer.all_special_tokens``),
            read only when it has no template (the template decides how conversations are written).

    Returns:
        `Recognition` or `None`: an exact match on a known template's sha256, else the first of `MARKER_RULES`
        whose markers all occur in the template (or, without a template, among the special tokens); `None` for
        an unknown template (a plain ChatML one, for example).
    """
    if chat_template:
        known = KNOWN_TEMPLATES.get(template_sha256(chat_template))
        if known is not None:
            template, family = known
            return Recognition(FAMILIES_BY_NAME[family], EXACT, template=template)
        found = _by_markers(chat_template)
        return Recognition(FAMILIES_BY_NAME[found[0]], MARKERS, markers=found[1]) if found else None
    tokens = set(special_tokens)
    found = _by_markers(tokens) if tokens else None
    return Recognition(FAMILIES_BY_NAME[found[0]], MARKERS, markers=found[1], source="special tokens") if found else None


def _by_markers(text) -> Optional[Tuple[str, Tuple[str, ...]]]:
    """The first rule of `MARKER_RULES` whose markers all occur in `text` (a template, or a set of tokens):
    (family name, markers)."""
    for family, markers in MARKER_RULES:
        if all(marker in text for marker in markers):
            return family, markers
    return None
