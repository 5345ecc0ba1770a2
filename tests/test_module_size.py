"""Every Python module of the project stays at most `MAX_LINES` lines: the library (textenv/), the benchmarks,
the examples and the tests, but for TRL's own tests (tests/legacy/, vendored as they are) and test data
(tests/data/). A source scan: nothing is imported."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400
SCANNED = ("textenv", "benchmarks", "examples", "tests")
EXEMPT = (ROOT / "tests" / "legacy", ROOT / "tests" / "data")


def line_count(path: Path) -> int:
    """The file's lines: its newlines, as `wc -l` counts, plus a last line that has none."""
    text = path.read_text(encoding="utf-8")
    return text.count("\n") + (not text.endswith("\n") and bool(text))


def scanned_modules() -> list[Path]:
    """Every .py file under the scanned folders, but those under an exempt one."""
    modules = (path for folder in SCANNED for path in sorted((ROOT / folder).rglob("*.py")))
    return [path for path in modules if not any(path.is_relative_to(exempt) for exempt in EXEMPT)]


def test_the_scan_sees_the_modules_it_should():
    relative = {path.relative_to(ROOT).as_posix() for path in scanned_modules()}
    assert {"textenv/__init__.py", "tests/conftest.py", "tests/test_module_size.py"} <= relative
    assert any(name.startswith("benchmarks/") for name in relative) and any(name.startswith("examples/") for name in relative)
    assert not any(name.startswith(("tests/legacy/", "tests/data/")) for name in relative)


def test_every_module_has_at_most_400_lines():
    too_long = {path.relative_to(ROOT).as_posix(): count for path in scanned_modules() if (count := line_count(path)) > MAX_LINES}
    assert not too_long, (
        f"modules over {MAX_LINES} lines: "
        + ", ".join(f"{name} ({count} lines)" for name, count in sorted(too_long.items()))
        + f". The rule: every module stays at most {MAX_LINES} lines. Split an offending module along a concept boundary "
        "into modules named for what they hold (keeping its public names importable from the old path), or, for a test "
        "module, along its themes into test_<topic>_<subtopic>.py modules (shared helpers in a small helper module)."
    )
