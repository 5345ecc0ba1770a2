"""The documentation site builds with `mkdocs build --strict` (no broken link, anchor or reference, no docstring
mkdocstrings cannot read) and its API reference documents every public name."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Packages whose `__all__` the reference documents on docs/reference/<name>.md, as `textenv.<package>.<name>`.
STATIC_PACKAGES = ["environment", "tools", "episodes", "engine", "chat", "ppo", "grpo", "gym", "training", "view"]
# Packages that import their names lazily (documented under the module that defines each).
LAZY_PACKAGES = ["vllm"]

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site_dir = tmp_path_factory.mktemp("site")
    completed = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)], cwd=ROOT,
                               capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert completed.returncode == 0, f"mkdocs build --strict failed:\n{completed.stderr[-4000:]}"
    return site_dir


def anchors(page: Path) -> set[str]:
    return set(re.findall(r'id="(textenv[\w.]*)"', page.read_text()))


@pytest.mark.parametrize("package", STATIC_PACKAGES)
def test_the_reference_documents_every_public_name_of_a_package(site, package):
    documented = anchors(site / "reference" / package / "index.html")
    public = importlib.import_module(f"textenv.{package}").__all__
    # A name the package imports lazily is documented under the module that defines it.
    missing = [name for name in public if not any(anchor.startswith(f"textenv.{package}.") and anchor.endswith(f".{name}") for anchor in documented)]
    assert not missing, f"docs/reference/{package}.md documents none of {missing}: export them with a docstring"


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_the_reference_documents_every_lazily_imported_name(site, package):
    documented = anchors(site / "reference" / package / "index.html")
    names = importlib.import_module(f"textenv.{package}")._PUBLIC_NAMES
    missing = [f"{module}.{name}" for name, module in names.items() if f"{module}.{name}" not in documented]
    assert not missing, f"docs/reference/{package}.md documents none of {missing}: add a `::: module.name` line"


def test_the_textenv_page_names_every_top_level_name(site):
    import textenv

    page = (ROOT / "docs" / "reference" / "textenv.md").read_text()
    missing = [name for name in textenv.__all__ if f"`{name}`" not in page]
    assert not missing, f"docs/reference/textenv.md does not list {missing}"

