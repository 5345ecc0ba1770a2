"""textenv.transformers_compat: the image-processor alias modules of transformers 5.16-5.20 no longer break
``unittest``'s ``assertWarns`` (it reads ``__warningregistry__`` from every loaded module)."""

import sys
import types
import unittest
import warnings

import pytest

import textenv.transformers_compat as compat

ALIAS = "transformers.models.textenv_test.image_processing_textenv_test_fast"


@pytest.fixture
def alias_module():
    """An alias module as transformers 5.16-5.20 build them: every name is forwarded to a target that fails to
    import (as one needing torchvision does where torchvision is not installed)."""

    def forward(name):
        if name == "ImageProcessor":
            return "the target's ImageProcessor"
        raise ModuleNotFoundError("No module named 'torchvision'")

    module = types.ModuleType(ALIAS)
    module.__getattr__ = forward
    sys.modules[ALIAS] = module
    yield module
    del sys.modules[ALIAS]


def test_an_unwrapped_alias_breaks_assert_warns(alias_module):
    with pytest.raises(ModuleNotFoundError, match="torchvision"):
        with unittest.TestCase().assertWarns(UserWarning):
            warnings.warn("a warning", UserWarning)


def test_wrapped_aliases_raise_attribute_error_for_dunders_and_forward_other_names(alias_module):
    assert compat.make_alias_modules_dunder_safe() >= 1
    assert compat.make_alias_modules_dunder_safe() == 0  # already wrapped
    with pytest.raises(AttributeError):
        alias_module.__warningregistry__
    assert alias_module.ImageProcessor == "the target's ImageProcessor"
    with pytest.raises(ModuleNotFoundError):
        alias_module.OtherProcessor
    with unittest.TestCase().assertWarns(UserWarning):
        warnings.warn("a warning", UserWarning)


def test_assert_warns_works_with_the_installed_transformers_after_importing_textenv():
    import textenv.ppo  # noqa: F401  (applies the fix, as in legacy TRL's PPO tests)

    with unittest.TestCase().assertWarns(UserWarning):
        warnings.warn("a warning", UserWarning)
