"""Real tokenizers of five vocabulary families, for tests that must hold on the token ids real models see.

``real_tokenizer(name)`` returns a ``PreTrainedTokenizerFast`` (transformers' ``TokenizersBackend``) built from a
``tokenizer.json`` vendored xz-compressed in ``tests/fixtures/tokenizers/``: the released model's own vocabulary,
merges, pre-tokenizer, post-processor and added tokens at their real ids, with bos/eos/pad/unk set as the released
(instruct) model sets them. Nothing is downloaded: the files were obtained once, at development time, from public
packages and repositories and checked against the model makers' own files; the fixtures' README.md lists, per
name, where each came from, its sha256, its licence and the conversion done. None is a sibling stand-in.

| name | the tokenizer of | len(tokenizer) |
| --- | --- | --- |
| ``qwen`` | Qwen3; Qwen2.5 has the same ids up to 151664 (no ``<think>``), Qwen2 up to 151645 | 151,669 |
| ``llama3`` | Llama 3.1 / 3.2 / 3.3 (Llama 3.0: the same ids, older names for 128004, 128008, 128010) | 128,256 |
| ``gemma3`` | Gemma 3 | 262,145 |
| ``mistral_tekken`` | Mistral's tekken v3 (``tekken_240911.json``, with mistral-common's 20 named control tokens) | 131,072 |
| ``gpt_oss`` | GPT-OSS (o200k_harmony, as the hub's tokenizer.json holds it) | 200,019 |

The tokenizer is cached per process and shared: ``copy.deepcopy`` it before adding tokens or changing settings.
A family without a file here runs on a sibling vocabulary: ``SIBLING`` and the README's table suggest which.
"""

from __future__ import annotations

import functools
import hashlib
import lzma
from dataclasses import dataclass, field
from pathlib import Path

FIXTURE_DIR = Path(__file__).parent / "fixtures" / "tokenizers"
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Family:
    """One vendored tokenizer: its file, the sha256 of the decompressed tokenizer.json, the released model whose
    tokenizer it is, the special-token settings that model's tokenizer_config.json gives (bos/eos/pad/unk), and the
    tokenizer class ``AutoTokenizer`` picks for that model (its pipeline must give the same ids)."""

    file: str
    sha256: str
    model: str
    special: dict[str, str] = field(default_factory=dict)
    transformers_class: str = "PreTrainedTokenizerFast"
    clean_up_tokenization_spaces: bool = False


FAMILIES: dict[str, Family] = {
    "qwen": Family(
        "qwen.tokenizer.json.xz", "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
        "Qwen3 (the instruct / hybrid-thinking releases); Qwen2.5 shares its ids up to 151664, Qwen2 up to 151645",
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, "Qwen2Tokenizer"),
    "llama3": Family(
        "llama3.tokenizer.json.xz", "79e3e522635f3171300913bb421464a87de6222182a0570b9b2ccba2a964b2b4",
        "Llama 3.1 Instruct (3.2 and 3.3 use the same file)",
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, clean_up_tokenization_spaces=True),
    "gemma3": Family(
        "gemma3.tokenizer.json.xz", "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795",
        "Gemma 3 (every size, pretrained and instruct)",
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}, "GemmaTokenizer"),
    "mistral_tekken": Family(
        "mistral_tekken.tokenizer.json.xz", "86150969e5647911369bbf28086fdad5fa5134f887e1a03a4e94030ad8e5468a",
        "Mistral tekken_240911.json (mistral-common 1.13.1), converted by transformers' MistralConverter",
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}),
    "gpt_oss": Family(
        "gpt_oss.tokenizer.json.xz", "0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3",
        "gpt-oss-20b / gpt-oss-120b",
        {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"}),
}
REAL_TOKENIZERS: tuple[str, ...] = tuple(FAMILIES)

# A family with no vocabulary of its own here -> the real tokenizer to run it on (a stand-in: its ids are not the
# family's). The README's sibling table says how close each is; none is used by this module.
SIBLING: dict[str, str] = {
    "deepseek_r1_distill_qwen": "qwen",  # Qwen2.5's vocabulary with DeepSeek's own special tokens at 151646-151664
    "deepseek_v3": "qwen",  # its own 128k byte-level BPE: a stand-in of the same kind
    "glm4": "qwen",  # its own ~151k byte-level BPE: a stand-in of the same kind
    "phi4_mini": "gpt_oss",  # o200k_base's 199,998 ranks plus Phi's own special tokens
    "phi3_5": "gemma3",  # Llama 2's 32k SentencePiece BPE with byte fallback; Gemma 3's is the same kind
    "lfm2": "llama3",  # its own 65k byte-level BPE
    "nemotron_nano": "mistral_tekken",  # its own 131k byte-level BPE: a stand-in of the same size and kind
}


def fixture_path(name: str) -> Path:
    """The vendored file of `name` (one of ``REAL_TOKENIZERS``)."""
    if name not in FAMILIES:
        raise KeyError(f"no real tokenizer {name!r}; the names are {', '.join(REAL_TOKENIZERS)}")
    return FIXTURE_DIR / FAMILIES[name].file


@functools.cache
def tokenizer_json(name: str) -> str:
    """The decompressed tokenizer.json of `name`, checked against its recorded sha256."""
    path = fixture_path(name)
    if not path.is_file():
        relative = path.relative_to(ROOT).as_posix()
        raise FileNotFoundError(f"real tokenizer {name!r}: {relative} is missing; restore it with "
                                f"`git checkout -- {relative}` (sources: tests/fixtures/tokenizers/README.md)")
    raw = lzma.decompress(path.read_bytes())
    digest = hashlib.sha256(raw).hexdigest()
    if digest != FAMILIES[name].sha256:
        raise ValueError(f"real tokenizer {name!r}: {path.name} decompresses to sha256 {digest}, not the recorded "
                         f"{FAMILIES[name].sha256} (see tests/fixtures/tokenizers/README.md)")
    return raw.decode("utf-8")


@functools.cache
def real_tokenizer(name: str):
    """The real tokenizer of `name` (``"qwen"``, ``"llama3"``, ``"gemma3"``, ``"mistral_tekken"``, ``"gpt_oss"``):
    a ``PreTrainedTokenizerFast`` with the released model's vocabulary, merges and added tokens at their real ids,
    bos/eos/pad/unk as that model sets them. Cached per process and shared (deep-copy it before changing it).
    Every name is the family's own vocabulary; none is a sibling stand-in."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(tokenizer_json(name))  # raises for an unknown name or a missing file
    family = FAMILIES[name]
    return PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=family.clean_up_tokenization_spaces,
                                   **family.special)
