"""A real chat template on a real vocabulary: ``family_tokenizer(template)`` is the vendored tokenizer of the template's
family (``tests/real_tokenizers.py``), or a sibling's where the family has none here (a stand-in: its ids are not the
family's own), wearing the real template (``tests/fixtures/chat_templates/real/``) with the family's special tokens
the vocabulary lacks added (`textenv.chat.families.Family.special_tokens`).

| family | vocabulary | own? |
| --- | --- | --- |
| Qwen2.5, Qwen3 | ``qwen`` (Qwen3's; Qwen2.5 has the same ids up to 151664) | yes |
| Llama 3.1 / 3.2 | ``llama3`` | yes |
| Gemma 3 | ``gemma3`` | yes |
| GPT-OSS | ``gpt_oss`` | yes |
| Mistral (v7/v13 templates) | ``mistral_tekken`` (tekken v3; v13's ``[ARGS]`` and ``[CALL_ID]`` added at new ids) | yes, but for those two |
| Qwen3.5, DeepSeek, GLM-4.5 | ``qwen`` | stand-in |
| Nemotron 3 Nano | ``mistral_tekken`` | stand-in |
| Gemma 4, Phi-3.5 | ``gemma3`` | stand-in |
| Phi-4-mini | ``gpt_oss`` | stand-in |
| LFM2, LFM2.5 | ``llama3`` | stand-in |

The stand-ins are `real_tokenizers.SIBLING`'s suggestions, and two it does not list: Gemma 4 on Gemma 3's (a 262k
SentencePiece vocabulary of the same kind, its control tokens added) and Qwen3.5 on Qwen3's (not claimed to be its
own). An own vocabulary keeps the released model's bos/eos; a stand-in gets the family's bos and, as eos, its first
stop string (as `chat_fixtures.real_template_tokenizer` sets them on SmolLM2). Tokenizers are built once per process
and shared: deep-copy one before changing it.
"""

from __future__ import annotations

import copy
import functools

from chat_fixtures import real_template
from real_tokenizers import real_tokenizer
from textenv.chat.families import FAMILIES_BY_NAME, Family
from textenv.chat.template_hashes import KNOWN_TEMPLATES

# family name -> (vendored vocabulary, whether it is the family's own)
VOCABULARY: dict[str, tuple[str, bool]] = {
    "qwen2_5": ("qwen", True), "qwen3": ("qwen", True), "llama3": ("llama3", True), "gemma3": ("gemma3", True),
    "gpt_oss": ("gpt_oss", True), "mistral": ("mistral_tekken", True),
    "qwen3_5": ("qwen", False), "deepseek_r1_distill": ("qwen", False), "deepseek_v3": ("qwen", False),
    "glm4_moe": ("qwen", False), "nemotron_3_nano": ("mistral_tekken", False), "gemma4": ("gemma3", False),
    "phi3_5": ("gemma3", False), "phi4_mini": ("gpt_oss", False), "lfm2": ("llama3", False), "lfm2_5": ("llama3", False),
}
TEMPLATE_FAMILY: dict[str, str] = {template: family for template, family in KNOWN_TEMPLATES.values()}


def family_of(template: str) -> Family:
    """The family the vendored template `template` belongs to."""
    return FAMILIES_BY_NAME[TEMPLATE_FAMILY[template]]


def vocabulary_of(template: str) -> tuple[str, bool]:
    """`(vocabulary name, own)` the template runs on: ``own`` is False for a sibling stand-in."""
    return VOCABULARY[TEMPLATE_FAMILY[template]]


@functools.cache
def family_tokenizer(template: str):
    """The vocabulary of `template`'s family (`vocabulary_of`) with the template as its chat template and the family's
    missing special tokens added; built once per process (deep-copy it before changing it)."""
    family = family_of(template)
    name, own = vocabulary_of(template)
    tokenizer = copy.deepcopy(real_tokenizer(name))
    tokenizer.chat_template = real_template(template)
    vocabulary = tokenizer.get_vocab()
    tokens: dict = {"additional_special_tokens": [token for token in family.special_tokens if token not in vocabulary]}
    if not own:
        if family.bos_token:
            tokens["bos_token"] = family.bos_token
        tokens["eos_token"] = family.stop[0]
    tokenizer.add_special_tokens(tokens, replace_extra_special_tokens=False)
    return tokenizer
