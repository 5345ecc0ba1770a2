"""The installed transformers lies inside the range pyproject.toml declares, so a virtual environment
outside it fails here, loudly, instead of somewhere obscure. `make test` runs the suite at both ends of
that range: in .venv (the newest release) and in .venv-lower (the pin in .ci/lower-bounds.txt)."""

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


def test_installed_transformers_is_inside_the_declared_range():
    specifier = declared_specifier("transformers")
    installed = version("transformers")
    assert specifier.contains(installed, prereleases=True), (
        f"transformers {installed} is installed, but pyproject.toml supports only transformers{specifier}"
    )


def test_lower_bound_venv_pins_the_declared_minimum():
    # .venv-lower must test the range's own lower bound: the pin and the `>=` move together.
    pins = {}
    for line in (ROOT / ".ci" / "lower-bounds.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            pins[requirement.name] = requirement.specifier
    (pin,) = pins["transformers"]
    (minimum,) = [spec for spec in declared_specifier("transformers") if spec.operator == ">="]
    assert pin.operator == "==" and Version(pin.version) == Version(minimum.version), (
        f".ci/lower-bounds.txt pins transformers{pin}, pyproject.toml declares transformers{minimum}"
    )
