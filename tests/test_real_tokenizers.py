"""The real tokenizers of tests/real_tokenizers.py hold the released models' vocabularies: sizes, special-token ids,
known encodings, round trips, and the same ids under every transformers release the suite runs (this module runs
in both halves of `make test`: .venv and .venv-lower).

Where the expected values come from (tests/fixtures/tokenizers/README.md has the full record):
- Qwen: Qwen3's tokenizer.json; its 151,643 regular tokens equal dashscope's ``qwen.tiktoken`` (Alibaba's wheel).
- Llama 3: Meta's llama-models (the 3.1 release's ``tokenizer.py`` special tokens, ``tokenizer.model`` ranks).
- Gemma 3: google-deepmind/gemma ``gm/text/_tokenizer.py`` (``_Gemma3SpecialTokens``) and the GGUF vocabulary of
  google/gemma-3-270m.
- Mistral tekken: mistral-common's ``Tekkenizer`` (``DEPRECATED_SPECIAL_TOKENS`` of tekken_240911.json).
- GPT-OSS: openai/harmony ``src/tiktoken_ext/public_encodings.rs`` (o200k_harmony).
The encodings below were checked, outside the suite, against tiktoken with each vendor's own rank file (Qwen,
Llama 3, GPT-OSS) and against mistral-common's Tekkenizer (tekken); Gemma 3's against the GGUF vocabulary's pieces.
"""

import dataclasses
import hashlib
import json

import pytest

import real_tokenizers
from real_tokenizers import FAMILIES, FIXTURE_DIR, REAL_TOKENIZERS, SIBLING, real_tokenizer, tokenizer_json

LENGTHS = {"qwen": 151669, "llama3": 128256, "gemma3": 262145, "mistral_tekken": 131072, "gpt_oss": 200019}

SPECIAL_IDS = {
    "qwen": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
             "</tool_call>": 151658, "<tool_response>": 151665, "</tool_response>": 151666, "<think>": 151667,
             "</think>": 151668},
    "llama3": {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|finetune_right_pad_id|>": 128004,
               "<|start_header_id|>": 128006, "<|end_header_id|>": 128007, "<|eom_id|>": 128008, "<|eot_id|>": 128009,
               "<|python_tag|>": 128010, "<|reserved_special_token_247|>": 128255},
    "gemma3": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4, "<start_of_turn>": 105,
               "<end_of_turn>": 106, "<start_of_image>": 255999, "<end_of_image>": 256000, "<image_soft_token>": 262144},
    "mistral_tekken": {"<unk>": 0, "<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4, "[AVAILABLE_TOOLS]": 5,
                       "[/AVAILABLE_TOOLS]": 6, "[TOOL_RESULTS]": 7, "[/TOOL_RESULTS]": 8, "[TOOL_CALLS]": 9, "<pad>": 11,
                       "[SYSTEM_PROMPT]": 17, "[/SYSTEM_PROMPT]": 18, "<SPECIAL_20>": 20, "<SPECIAL_999>": 999},
    "gpt_oss": {"<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002, "<|constrain|>": 200003,
                "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008, "<|call|>": 200012},
}

# bos / eos / pad ids as the released (instruct) model's tokenizer sets them; None: the model sets none.
ROLE_IDS = {
    "qwen": (None, 151645, 151643),
    "llama3": (128000, 128009, None),
    "gemma3": (2, 1, 0),
    "mistral_tekken": (1, 2, 11),
    "gpt_oss": (199998, 200002, 199999),
}

UNICODE = "Größe: 42 °C — naïve café, 中文 😀"
TOOL_CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
# encode(text) with the model's default special tokens (Llama 3, Gemma 3 and tekken prepend their bos).
ENCODINGS = {
    "qwen": {"Hello world": [9707, 1879],
             UNICODE: [6464, 78940, 25, 220, 19, 17, 36286, 34, 1959, 94880, 586, 51950, 11, 72858, 16744, 90316],
             TOOL_CALL: [4913, 606, 788, 330, 455, 69364, 497, 330, 16370, 788, 5212, 8926, 788, 330, 59604, 497, 330,
                         3843, 788, 330, 66, 40247, 30975]},
    "llama3": {"Hello world": [128000, 9906, 1917],
               UNICODE: [128000, 6600, 80040, 25, 220, 2983, 37386, 34, 2001, 95980, 588, 53050, 11, 73958, 17161, 91416],
               TOOL_CALL: [128000, 5018, 609, 794, 330, 456, 70464, 498, 330, 16774, 794, 5324, 9103, 794, 330, 60704,
                           498, 330, 3928, 794, 330, 66, 41347, 32075]},
    "gemma3": {"Hello world": [2, 9259, 1902],
               UNICODE: [2, 9322, 237001, 16756, 236787, 236743, 236812, 236778, 14324, 236780, 2192, 120362, 33443,
                         236764, 17346, 237364, 163543],
               TOOL_CALL: [2, 14937, 1201, 1083, 623, 828, 236779, 19323, 827, 623, 33178, 1083, 3714, 13319, 1083, 623,
                           50429, 827, 623, 6805, 1083, 623, 236755, 42024, 127096]},
    "mistral_tekken": {"Hello world": [1, 22177, 4304],
                       UNICODE: [1, 20560, 1792, 9755, 1058, 1032, 1052, 1050, 6885, 1067, 2251, 98355, 35858, 1044,
                                 30549, 11449, 119685, 1152, 1128],
                       TOOL_CALL: [1, 19227, 2391, 2811, 1429, 1689, 1095, 45629, 1897, 1429, 61906, 2811, 16753, 29363,
                                   2811, 1429, 42572, 1897, 1429, 8979, 2811, 1429, 1099, 79092, 128202]},
    "gpt_oss": {"Hello world": [13225, 2375],
                UNICODE: [3193, 52715, 25, 220, 4689, 23335, 34, 2733, 153475, 737, 30469, 11, 83711, 88038],
                TOOL_CALL: [10848, 897, 1243, 392, 522, 170154, 672, 392, 34317, 1243, 10494, 17500, 1243, 392, 72782,
                            672, 392, 5400, 1243, 392, 66, 63110, 57612]},
}

# decode(encode(text)) == text without special tokens (NFC text: Qwen's normalizer composes NFD, tested below).
ROUND_TRIP = [
    UNICODE, TOOL_CALL, "Hello , world . I don't", "  two  spaces\tand a tab\n\n\nnewlines  ",
    "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"7 * 8\"}}\n</tool_call>",
    "def f(x):\n    return x ** 2  # square\n", "Emoji: 👨‍👩‍👧‍👦 🇫🇷 ❤️ and CJK 日本語のテキスト، العربية",
    "numbers 1234567890 3.14159 -42 1e-9", "\x00\x01\x7f control", "a" * 200,
]

# sha256 of the ids of every ROUND_TRIP text and every ENCODINGS key: one value per tokenizer, recorded under
# transformers 5.24 (.venv); the lower-bound half (transformers 5.16.1) must reproduce it. Checked outside the suite
# against tiktoken with the vendors' rank files (Qwen, Llama 3, GPT-OSS) and mistral-common's Tekkenizer (tekken).
IDS_SHA256 = {
    "qwen": "8e1ca3c08f27b0a9a5fac698c4ebd75bd3685470c9efcd04cd3d291846808506",
    "llama3": "4affae9fdd580e84314ef5fdd6a570f3c8a0906a2348308469a7a4d005b12423",
    "gemma3": "bfc85b35462dc682b13cd0256950b0fd187be5f18bb04c21ec4fc70b4ff28e17",
    "mistral_tekken": "060ad81209788853efb2a3c74e0795b6fd529642dc0a7e32ca513c76e56c1051",
    "gpt_oss": "5be331608c85dfae8c06af0293c9fb314ba826f987bef0f88a0f2a1c48067286",
}


def ids_digest(tokenizer):
    texts = ROUND_TRIP + list(ENCODINGS["qwen"])
    return hashlib.sha256(json.dumps([tokenizer.encode(text) for text in texts]).encode()).hexdigest()


@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_vocabulary_size_and_contiguous_ids(name):
    tokenizer = real_tokenizer(name)
    assert len(tokenizer) == LENGTHS[name]
    ids = set(tokenizer.get_vocab().values())
    assert ids == set(range(LENGTHS[name])), "the ids must run from 0 to len(tokenizer) - 1 without a gap"


@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_special_tokens_sit_at_their_real_ids(name):
    tokenizer = real_tokenizer(name)
    for token, token_id in SPECIAL_IDS[name].items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id, token
        assert tokenizer.convert_ids_to_tokens(token_id) == token, token_id
        # registered as an added token: the text of it is one token, never split into pieces
        assert tokenizer.encode(token, add_special_tokens=False) == [token_id], token
        assert token_id in tokenizer.added_tokens_decoder, token


@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_bos_eos_pad_as_the_released_model_sets_them(name):
    tokenizer = real_tokenizer(name)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == ROLE_IDS[name]


@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_known_encodings(name):
    tokenizer = real_tokenizer(name)
    for text, ids in ENCODINGS[name].items():
        assert tokenizer.encode(text) == ids, text


@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_decode_of_encode_gives_the_text_back(name):
    tokenizer = real_tokenizer(name)
    for text in ROUND_TRIP:
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text, text
    bos = tokenizer.bos_token_id
    if bos is not None and tokenizer.encode("x")[0] == bos:
        assert tokenizer.decode(tokenizer.encode(TOOL_CALL), skip_special_tokens=True) == TOOL_CALL


def test_quirks_of_the_real_tokenizers():
    # Qwen normalizes to NFC before tokenizing: NFD text does not come back as it went in.
    qwen = real_tokenizer("qwen")
    assert qwen.encode("e\u0301") == qwen.encode("\u00e9")
    assert qwen.decode(qwen.encode("e\u0301")) == "\u00e9"
    # Llama 3.1's tokenizer_config.json asks for clean_up_tokenization_spaces=True; transformers ignores it for BPE.
    llama = real_tokenizer("llama3")
    assert llama.decode(llama.encode("Hello , world", add_special_tokens=False)) == "Hello , world"
    # Special-token text inside plain text becomes the special token (transformers' default; mistral-common's
    # Tekkenizer would spell "[TOOL_CALLS]" out in pieces instead).
    assert real_tokenizer("mistral_tekken").encode("a [TOOL_CALLS]", add_special_tokens=False)[-1] == 9


@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_same_ids_under_every_transformers_release_the_suite_runs(name):
    assert ids_digest(real_tokenizer(name)) == IDS_SHA256[name]


OWN_CLASS = [name for name in REAL_TOKENIZERS if FAMILIES[name].transformers_class != "PreTrainedTokenizerFast"]


@pytest.mark.parametrize("name", OWN_CLASS)
def test_the_class_autotokenizer_picks_gives_the_same_ids(name, tmp_path):
    """AutoTokenizer builds Qwen2Tokenizer / GemmaTokenizer from the vocabulary and merges with its own pipeline
    code: on the real checkpoint it must give the ids of the vendored tokenizer.json's pipeline."""
    from transformers import AutoTokenizer

    family = FAMILIES[name]
    (tmp_path / "tokenizer.json").write_text(tokenizer_json(name), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": family.transformers_class, **family.special}))
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert type(loaded).__name__ == family.transformers_class
    assert len(loaded) == LENGTHS[name]
    assert ids_digest(loaded) == IDS_SHA256[name]


def test_a_missing_or_altered_file_fails_in_one_line_naming_the_fix(monkeypatch):
    qwen = FAMILIES["qwen"]
    missing = dataclasses.replace(qwen, file="missing.tokenizer.json.xz")
    monkeypatch.setitem(real_tokenizers.FAMILIES, "qwen", missing)
    with pytest.raises(FileNotFoundError) as error:
        tokenizer_json.__wrapped__("qwen")
    assert "\n" not in str(error.value)
    assert "git checkout -- tests/fixtures/tokenizers/missing.tokenizer.json.xz" in str(error.value)
    altered = dataclasses.replace(qwen, sha256="0" * 64)
    monkeypatch.setitem(real_tokenizers.FAMILIES, "qwen", altered)
    with pytest.raises(ValueError, match="not the recorded"):
        tokenizer_json.__wrapped__("qwen")
    with pytest.raises(KeyError, match="the names are qwen, llama3, gemma3, mistral_tekken, gpt_oss"):
        real_tokenizer("deepseek")


def test_the_readme_records_every_file_and_the_fixtures_stay_small():
    readme = (FIXTURE_DIR / "README.md").read_text(encoding="utf-8")
    for name, family in FAMILIES.items():
        data = (FIXTURE_DIR / family.file).read_bytes()
        assert family.file in readme and family.sha256 in readme, name
        assert hashlib.sha256(data).hexdigest() in readme, f"{family.file}: the README lacks the compressed file's sha256"
    for sibling in SIBLING.values():
        assert sibling in REAL_TOKENIZERS
    for licence in ("Apache-2.0.txt", "Llama-3.1-COMMUNITY-LICENSE.txt", "Llama-3.1-USE_POLICY.md", "NOTICE.txt"):
        assert (FIXTURE_DIR / "LICENSES" / licence).is_file(), licence
    total = sum(path.stat().st_size for path in FIXTURE_DIR.rglob("*") if path.is_file())
    assert total <= 30 * 1024 * 1024, f"the vendored tokenizers take {total} bytes: more than the 30 MB allowed"
