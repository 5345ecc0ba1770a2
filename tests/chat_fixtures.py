"""Chat-template fixtures for tests: the bundled SmolLM2 tokenizer dressed up with another model family's
chat template (from ``tests/fixtures/chat_templates/``) and, where that family has them, its special tokens."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

TEMPLATE_DIR = Path(__file__).parent / "fixtures" / "chat_templates"
FIXTURE_TEMPLATES = ("hermes_qwen", "llama3", "mistral", "qwen3_thinking")

# Per fixture: the tokens added as special tokens and the eos/bos the template is rendered with.
FIXTURE_SPECIAL_TOKENS: dict[str, dict[str, object]] = {
    "llama3": {
        "additional_special_tokens": [
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ],
        "eos_token": "<|eot_id|>",
        "bos_token": "<|begin_of_text|>",
    },
    "mistral": {
        "additional_special_tokens": [
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ],
        "eos_token": "</s>",
        "bos_token": "<s>",
    },
}


def fixture_template(name: str) -> str:
    """The Jinja source of the fixture template `name` (one of `FIXTURE_TEMPLATES`)."""
    if name not in FIXTURE_TEMPLATES:
        raise ValueError(f"unknown chat-template fixture {name!r}; one of {FIXTURE_TEMPLATES}")
    return (TEMPLATE_DIR / f"{name}.jinja").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _bundled_tokenizer():
    from textenv.models import load_tokenizer

    return load_tokenizer()


def fixture_tokenizer(name: str):
    """A copy of the bundled SmolLM2 tokenizer with the fixture's chat template and special tokens.

    Args:
        name (`str`): one of `FIXTURE_TEMPLATES`.

    Returns:
        A new tokenizer; the bundled one (loaded once per process) is left untouched.
    """
    template = fixture_template(name)
    tokenizer = copy.deepcopy(_bundled_tokenizer())
    tokenizer.chat_template = template
    if name in FIXTURE_SPECIAL_TOKENS:
        tokenizer.add_special_tokens(copy.deepcopy(FIXTURE_SPECIAL_TOKENS[name]))
    return tokenizer
