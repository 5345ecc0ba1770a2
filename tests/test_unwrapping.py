"""`unwrap_model` skips accelerate's module walk for a bare model, and unwraps containers as accelerate does."""

import accelerate.utils
import pytest
import torch

from textenv import AutoModelForCausalLMWithValueHead
from textenv.engine.unwrapping import unwrap_model


def test_a_bare_model_is_returned_without_walking_its_modules(tiny_model, monkeypatch):
    def walk(*args, **kwargs):
        raise AssertionError("extract_model_from_parallel was called for a model no container wraps")

    monkeypatch.setattr(accelerate.utils, "extract_model_from_parallel", walk)
    assert unwrap_model(tiny_model) is tiny_model
    assert unwrap_model(AutoModelForCausalLMWithValueHead(tiny_model)) is tiny_model


@pytest.mark.parametrize("wrap", [torch.nn.DataParallel, torch.compile], ids=["DataParallel", "compiled"])
def test_containers_are_unwrapped_as_accelerate_does(tiny_model, wrap):
    wrapped = wrap(AutoModelForCausalLMWithValueHead(tiny_model))
    expected = accelerate.utils.extract_model_from_parallel(wrapped)
    expected = getattr(expected, "pretrained_model", expected)
    assert unwrap_model(wrapped) is expected
    if wrap is torch.nn.DataParallel:
        assert expected is tiny_model


def test_a_model_with_a_compiled_layer_is_itself(tiny_model):
    # accelerate 1.9's extract_model_from_parallel raises KeyError('_orig_mod') here; newer ones return the model
    tiny_model.model.layers[0] = torch.compile(tiny_model.model.layers[0])
    assert unwrap_model(tiny_model) is tiny_model
