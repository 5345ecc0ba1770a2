"""Process machinery of the Python sandbox: run untrusted code in a separate, limited, disposable process.

The parent (:mod:`.process`) makes a fresh working directory and a scrubbed environment (:mod:`.workspace`),
picks an interpreter the sandbox user can run (:mod:`.interpreter`) and a uid of its own when root
(:mod:`.identity`), starts the child program (:mod:`.child`, configured by :mod:`.bootstrap`), enforces the
wall-clock timeout and the output cap, and kills what is left at the end (:mod:`.reaper`). The child sets
up the kernel layers (rlimits; network, PID and, as root, mount namespaces; the uid switch; no
capabilities; Landlock) and the audit hook, reports them, then runs the snippet. :mod:`.isolation` finds
once which layers this machine grants and what a missing one leaves open; :mod:`.limits` holds
`SandboxLimits`. Main names: `run_python`, `SandboxResult`, `SandboxLimits`, `sandbox_interpreter`. Each
layer is documented on :class:`~textenv.tools.PythonInterpreter`.

May import: nothing from textenv
"""

from .interpreter import sandbox_interpreter
from .limits import SandboxLimits
from .process import SandboxResult, run_python
from .workspace import SNIPPET_FILENAME

__all__ = ["SNIPPET_FILENAME", "SandboxLimits", "SandboxResult", "run_python", "sandbox_interpreter"]
