"""The installed torch, transformers, trl, accelerate and peft lie inside the ranges pyproject.toml declares, so a
virtual environment outside them fails here, loudly, instead of somewhere obscure. `make test` runs the suite
at both ends of each range: in .venv (the newest releases) and in .venv-lower (the pins in
.ci/lower-bounds.txt); every range has an upper bound, the newest minor release the suite has passed on."""

from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent


def declared_specifier(name):
    """The version specifier pyproject.toml's [project] dependencies give `name`."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for line in dependencies:
        requirement = Requirement(line)
        if requirement.name == name:
            return requirement.specifier
    raise AssertionError(f"pyproject.toml does not list {name}")


# The packages whose internals textenv uses: each has a range checked at both ends.
CHECKED_PACKAGES = ("torch", "transformers", "trl", "accelerate", "peft")


def lower_bound_pins():
    """The `==` pins of .ci/lower-bounds.txt, by package name."""
    pins = {}
    for line in (ROOT / ".ci" / "lower-bounds.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            pins[requirement.name] = requirement.specifier
    return pins


@pytest.mark.parametrize("name", CHECKED_PACKAGES)
def test_installed_release_is_inside_the_declared_range(name):
    specifier = declared_specifier(name)
    installed = version(name)
    assert specifier.contains(installed, prereleases=True), (
        f"{name} {installed} is installed, but pyproject.toml supports only {name}{specifier}"
    )


@pytest.mark.parametrize("name", CHECKED_PACKAGES)
def test_range_has_a_tested_upper_bound(name):
    # An open range lets `pip install textenv` resolve to a release no CI run has seen.
    operators = {spec.operator for spec in declared_specifier(name)}
    assert "<" in operators, f"pyproject.toml declares {name}{declared_specifier(name)}: give it the `<` bound CI has passed on"


@pytest.mark.parametrize("name", CHECKED_PACKAGES)
def test_lower_bound_venv_pins_the_declared_minimum(name):
    # .venv-lower must test each range's own lower bound: the pin and the `>=` move together.
    pins = lower_bound_pins()
    assert name in pins, f".ci/lower-bounds.txt does not pin {name}: pin it to its range's minimum"
    (pin,) = pins[name]
    (minimum,) = [spec for spec in declared_specifier(name) if spec.operator == ">="]
    assert pin.operator == "==" and Version(pin.version) == Version(minimum.version), (
        f".ci/lower-bounds.txt pins {name}{pin}, pyproject.toml declares {name}{minimum}"
    )


def test_the_lower_bound_half_skips_only_modules_that_exist_and_never_this_one():
    """`--lower-bounds` (tests/scope.py) names test modules by file: a renamed module would silently run in
    both halves, a removed one would leave a stale reason; the version checks themselves must run in both."""
    from scope import LOWER_HALF_ONLY, VERSION_INDEPENDENT, VLLM_MODULES

    tests = Path(__file__).parent
    assert [name for name in VERSION_INDEPENDENT if not (tests / name).is_file()] == []
    assert [name for name in VLLM_MODULES if not (tests / name).is_file()] == []
    assert sorted(LOWER_HALF_ONLY - set(VERSION_INDEPENDENT)) == []  # a version-dependent module runs in both halves
    assert Path(__file__).name not in VERSION_INDEPENDENT and "test_vllm_faults.py" not in VERSION_INDEPENDENT
