"""The tool-aware ChatML template textenv ships, and the choice between it and a tokenizer's own.

Models whose chat template takes `tools=` (Qwen, Llama 3.x, Mistral, Hermes, ...) describe tools with
their own template. A ChatML template that ignores `tools=` (the bundled SmolLM2's) gets
`CHATML_TOOLS_TEMPLATE`: the Hermes / Qwen2.5 convention on ChatML.

* With tools, the system message (the template's default one if the conversation has none) ends with a
  `# Tools` section: every schema as one JSON line inside `<tools></tools>`, and the instruction to call
  a function as ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.
* An assistant message's `tool_calls` are written after its content in that form.
* Consecutive `tool` messages share one `user` turn, each inside ``<tool_response>\\n...\\n</tool_response>``.
* It is append-only: every message renders the same whatever follows it.
"""

from __future__ import annotations

from typing import Optional

SMOLLM_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

CHATML_TOOLS_TEMPLATE = (
    "{%- set default_system = default_system if default_system is defined else '" + SMOLLM_DEFAULT_SYSTEM + "' %}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] %}{%- set rest = messages[1:] %}"
    "{%- else %}{%- set system = default_system %}{%- set rest = messages %}{%- endif %}"
    "{{- '<|im_start|>system\\n' + system }}"
    "{%- if tools %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>' }}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- for message in rest %}"
    "{%- if message['role'] == 'tool' %}"
    "{%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{%- set function = call['function'] if call['function'] is defined else call %}"
    "{%- if (message['content'] or '') or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + function['name'] + '\", \"arguments\": ' }}"
    "{%- if function['arguments'] is string %}{{- function['arguments'] }}{%- else %}{{- function['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "textenv_probe_tool_7f3a", "description": "probe", "parameters": {"type": "object", "properties": {}}},
}


def template_takes_tools(tokenizer, chat_template: Optional[str] = None) -> bool:
    """Whether a chat template writes the `tools=` it is given into its text."""
    extra = {"chat_template": chat_template} if chat_template else {}
    messages = [{"role": "user", "content": "hi"}]
    try:
        text = tokenizer.apply_chat_template(messages, tools=[_PROBE_TOOL], tokenize=False, **extra)
    except Exception:  # noqa: BLE001 - a template that fails on tools does not take them
        return False
    return _PROBE_TOOL["function"]["name"] in text


class NoToolTemplate(ValueError):
    """The tokenizer's template cannot describe tools and textenv has none for it.

    Attributes:
        reason (`str`): what is wrong.
        fix (`str`): what to pass instead.
    """

    def __init__(self, reason: str, fix: str):
        super().__init__(f"{reason}. {fix}.")
        self.reason, self.fix = reason, fix


def tool_chat_template(tokenizer, chat_template: Optional[str] = None) -> Optional[str]:
    """The template to render tool conversations with: `chat_template` if given, `None` (the
    tokenizer's own) if that takes tools, else `CHATML_TOOLS_TEMPLATE` for a ChatML tokenizer.

    Raises:
        NoToolTemplate: the tokenizer's template takes no tools and is not ChatML.
    """
    if chat_template is not None:
        return chat_template
    own = getattr(tokenizer, "chat_template", None)
    if own and template_takes_tools(tokenizer):
        return None
    if own and "<|im_start|>" in own and "<|im_start|>" in getattr(tokenizer, "get_vocab", dict)():
        return CHATML_TOOLS_TEMPLATE
    raise NoToolTemplate(
        "tool_format='json' describes tools through the chat template, but the tokenizer's template ignores "
        "tools= and is not ChatML (textenv ships a tool template for ChatML only)",
        "Pass chat_template= (--chat_template FILE) with a template that renders `tools`",
    )


def read_chat_template(path: Optional[str]) -> Optional[str]:
    """The text of a ``--chat_template`` file (`None` without one).

    Raises:
        FileNotFoundError: no such file (names the option).
    """
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"--chat_template {path}: no such file (give a Jinja chat template file).") from None
