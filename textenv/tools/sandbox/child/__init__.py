"""The program that runs inside the sandboxed child, kept as ordinary modules (stdlib only, Python 3.8
compatible, since the child may run the system ``python3``) and joined into one source text by
:func:`child_program`: :mod:`.namespaces`, :mod:`.rlimits`, :mod:`.landlock`, :mod:`.audit_hook`, then
:mod:`.runner`, whose ``main`` runs last.

May import: nothing from textenv
"""

from __future__ import annotations

from pathlib import Path

CHILD_MODULES = ("namespaces", "rlimits", "landlock", "audit_hook", "runner")


def child_program() -> str:
    """The child modules' sources joined, followed by the call to ``main`` with the JSON config in argv[1]."""
    folder = Path(__file__).parent
    sources = [(folder / f"{name}.py").read_text(encoding="utf-8") for name in CHILD_MODULES]
    return "\n\n".join(sources) + "\n\nmain(json.loads(sys.argv[1]))\n"
