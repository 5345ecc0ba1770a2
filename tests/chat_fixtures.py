"""Chat-template fixtures for tests: the bundled SmolLM2 tokenizer dressed up with another model family's
chat template and, where that family has them, its special tokens. The hand-written templates are in
``tests/fixtures/chat_templates/``; the real ones, vendored from TRL and the model makers with their sources,
in ``tests/fixtures/chat_templates/real/`` (`real_template_tokenizer`)."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

TEMPLATE_DIR = Path(__file__).parent / "fixtures" / "chat_templates"
FIXTURE_TEMPLATES = ("hermes_qwen", "llama3", "mistral", "qwen3_thinking")
REAL_TEMPLATE_DIR = TEMPLATE_DIR / "real"
REAL_TEMPLATES = tuple(sorted(path.stem for path in REAL_TEMPLATE_DIR.glob("*.jinja")))

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


def real_template(name: str) -> str:
    """The text of the vendored real template `name` (one of `REAL_TEMPLATES`), byte for byte (a CRLF file
    keeps its line endings)."""
    if name not in REAL_TEMPLATES:
        raise ValueError(f"unknown real chat template {name!r}; one of {REAL_TEMPLATES}")
    return (REAL_TEMPLATE_DIR / f"{name}.jinja").read_bytes().decode("utf-8")


def family_stop_ids(tokenizer, family) -> list:
    """The ids of `family.stop` in `tokenizer`: what a released generation config of the family lists as eos ids (the
    certificate checks that a reply and a call turn end at one of them)."""
    vocabulary = tokenizer.get_vocab()
    return [vocabulary[token] for token in family.stop if token in vocabulary]


def real_template_tokenizer(name: str, family=None):
    """A copy of the bundled SmolLM2 tokenizer wearing the real template `name`, with its family's special tokens
    added (`textenv.chat.families.Family.special_tokens`), its `bos_token` and, as eos, its first stop string.

    Args:
        name (`str`): one of `REAL_TEMPLATES`.
        family (`Family`, *optional*): default: the family `textenv.chat.template_hashes` lists the template under.
    """
    from textenv.chat.families import FAMILIES_BY_NAME
    from textenv.chat.template_hashes import KNOWN_TEMPLATES

    if family is None:
        family = FAMILIES_BY_NAME[{template: family for template, family in KNOWN_TEMPLATES.values()}[name]]
    tokenizer = copy.deepcopy(_bundled_tokenizer())
    tokenizer.chat_template = real_template(name)
    tokens = {"additional_special_tokens": [token for token in family.special_tokens if token not in tokenizer.all_special_tokens]}
    if family.bos_token:
        tokens["bos_token"] = family.bos_token
    if family.stop:
        tokens["eos_token"] = family.stop[0]
    tokenizer.add_special_tokens(tokens, replace_extra_special_tokens=False)  # SmolLM2's own stay special
    return tokenizer
