"""Every package of textenv says what it may import from the rest of textenv, and its modules keep to it.

Each package's `__init__.py` docstring ends with one line, ``May import: textenv.a, textenv.b (why), ...`` or
``May import: nothing from textenv``: the other parts of textenv its modules may import. Text in parentheses is
a comment. A part is a package (a folder with an `__init__.py`) or a top-level module (`textenv/padding.py` is
`textenv.padding`); an import depends on the part that holds the imported module (``from textenv.engine.sampling
import X`` on `textenv.engine`, ``from textenv import off_policy`` on `textenv.off_policy`, ``from textenv import
lazy_exports`` on `textenv`).

The rules, checked on the source (ast), without importing anything:

- a package's line covers its own modules, and modules in folders below it without an `__init__.py`
  (`textenv/vllm/worker/`); a subpackage has a line of its own and is checked by that line only;
- a package may always import itself and its subpackages; anything else (its parent package too) must be
  listed, exactly: listing `textenv.tools` does not allow `textenv.tools.sandbox`;
- every import counts: at the top, inside functions, under ``if TYPE_CHECKING:``, relative ones, and the lazy
  ones spelled as strings (the name tables passed to `textenv.lazy_exports`, ``importlib.import_module`` with
  a literal name);
- the `textenv` package's line covers `textenv/__init__.py` only, and there only `textenv` itself is implicit
  (its lazy table names the packages it re-exports); the top-level modules (`textenv/cli.py`,
  `textenv/padding.py`, ...) are modules, not packages: they have no line and are not checked;
- every listed part exists and is imported by a module the line covers (a stale entry fails too).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "textenv"
FIX = "list it in the package docstring's May import line, or move the code"
MAY_IMPORT = re.compile(r"^May import: (.+)$")
NOTHING = "nothing from textenv"
PART_NAME = re.compile(r"^textenv(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def dotted(path: Path) -> str:
    """The dotted name of a folder or a module file under the repository root."""
    parts = path.relative_to(ROOT).with_suffix("").parts if path.suffix == ".py" else path.relative_to(ROOT).parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def packages() -> dict[str, Path]:
    """Every package of textenv: its dotted name -> its folder."""
    return {dotted(init.parent): init.parent for init in sorted(PACKAGE.rglob("__init__.py"))}


PACKAGES = packages()


def owner(module: Path) -> str:
    """The package whose line covers `module`: the nearest folder above it with an `__init__.py`."""
    folder = module.parent
    while not (folder / "__init__.py").exists():
        folder = folder.parent
    return dotted(folder)


def covered_modules(package: str) -> list[Path]:
    """The modules `package`'s line covers (the `textenv` package's: its `__init__.py` only)."""
    if package == "textenv":
        return [PACKAGE / "__init__.py"]
    return [path for path in sorted(PACKAGES[package].rglob("*.py")) if owner(path) == package]


def part_of(module: str) -> str | None:
    """The part of textenv that holds the module `module` (`None` outside textenv): the longest package prefix,
    or a top-level module, or `textenv` itself for a name defined in `textenv/__init__.py`."""
    names = module.split(".")
    if names[0] != "textenv":
        return None
    part = "textenv"
    for end in range(2, len(names) + 1):
        prefix = ".".join(names[:end])
        if prefix in PACKAGES:
            part = prefix
        elif end == 2 and (PACKAGE / f"{names[1]}.py").exists():
            return prefix
        else:
            break
    return part


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, module) of every import in `source`, a module of `package`, made absolute, wherever it is in the
    file, plus the lazy imports spelled as strings."""
    tree = ast.parse(source)
    here = package.split(".")
    found: list[tuple[int, str]] = []
    lazy_tables: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1]) if node.level else ""
            module = ".".join(name for name in (base, node.module) if name)
            # `from a import b` imports the module a.b when b is one; part_of stops at what exists.
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name == "import_module" and node.args and isinstance(node.args[0], ast.Constant):
                found.append((node.lineno, str(node.args[0].value)))
            if name == "lazy_exports" and len(node.args) > 1 and isinstance(node.args[1], ast.Name):
                lazy_tables.add(node.args[1].id)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(target, ast.Name) and target.id in lazy_tables for target in node.targets)):
            found += [(value.lineno, value.value) for value in node.value.values
                      if isinstance(value, ast.Constant) and isinstance(value.value, str)]
    return found


def may_import(package: str) -> list[str] | None:
    """The parts listed on `package`'s May import line (the docstring's last line), or `None` without one."""
    docstring = ast.get_docstring(ast.parse((PACKAGES[package] / "__init__.py").read_text(encoding="utf-8")))
    lines = [line.strip() for line in (docstring or "").strip().splitlines()]
    match = MAY_IMPORT.match(lines[-1]) if lines else None
    if match is None:
        return None
    listed = re.sub(r"\([^)]*\)", "", match.group(1)).strip()
    return [] if listed == NOTHING else [entry.strip() for entry in listed.split(",") if entry.strip()]


def dependencies(package: str) -> dict[str, list[str]]:
    """Each part of textenv outside `package` (and its subpackages) that the modules its line covers import ->
    where (`path:line imports module`)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in covered_modules(package):
        source = path.read_text(encoding="utf-8")
        for line, module in imported_modules(source, dotted(path if path.name == "__init__.py" else path.parent)):
            part = part_of(module)
            own = part == package or (package != "textenv" and part is not None and part.startswith(package + "."))
            if part is None or own:
                continue
            found[part].append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_package_docstring_ends_with_may_import_line(package):
    allowed = may_import(package)
    assert allowed is not None, (
        f"{PACKAGES[package].relative_to(ROOT)}/__init__.py: its docstring must end with one line "
        f"'May import: textenv.x, textenv.y' naming the parts of textenv its modules import "
        f"(or 'May import: {NOTHING}')")
    for entry in allowed:
        assert PART_NAME.match(entry) and part_of(entry) == entry, (
            f"{package}: '{entry}' on its May import line is not a package or a top-level module of textenv")


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_package_imports_only_what_its_line_allows(package):
    allowed = set(may_import(package) or ())
    found = dependencies(package)
    forbidden = sorted(f"{where} (part {part}): {FIX}" for part, places in found.items() if part not in allowed
                       for where in places)
    if forbidden:
        pytest.fail(f"{package} may import only {sorted(allowed) or NOTHING}:\n  " + "\n  ".join(forbidden),
                    pytrace=False)
    stale = sorted(allowed - set(found))
    if stale:
        pytest.fail(f"{package}'s May import line lists {stale}, which none of its modules imports: remove them from "
                    "the line", pytrace=False)


def test_every_kind_of_import_counts():
    """Relative, in-function, TYPE_CHECKING and lazy imports all count, each as the part that holds it."""
    source = (
        "import importlib\n"
        "from typing import TYPE_CHECKING\n"
        "from ..engine import sampling\n"
        "if TYPE_CHECKING:\n    from textenv.view.record import RunRecorder\n"
        "def f():\n    import textenv.tools.sandbox.limits\n    from textenv import padding, lazy_exports\n"
        "    importlib.import_module('textenv.vllm.client')\n"
        "TABLE = {'X': 'textenv.ppo.trainer'}\n"
        "__getattr__ = lazy_exports('textenv.gym.probe', TABLE, globals())\n")
    parts = [part_of(module) for _, module in imported_modules(source, "textenv.gym")]
    assert sorted(part for part in parts if part) == ["textenv", "textenv.engine", "textenv.padding", "textenv.ppo",
                                                      "textenv.tools.sandbox", "textenv.view", "textenv.vllm"]
