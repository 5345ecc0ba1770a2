"""Process machinery of the Python sandbox: run untrusted code in a separate, limited, disposable process.

The layers (each documented on :class:`~textenv.tools.PythonInterpreter`) are set up by a small
bootstrap program (:mod:`.bootstrap`) that runs first in the child interpreter, before the untrusted code:

1. a fresh temporary working directory (removed afterwards) and a scrubbed environment (:mod:`.workspace`);
2. a new network namespace (``unshare``), so only a down loopback interface exists;
3. ``resource`` limits (CPU, address space, processes, open files, file size, no core dumps);
4. when the parent runs as root: a switch to an unprivileged uid/gid of its own for this run
   (:mod:`.identity`), started with an interpreter that uid can run (:mod:`.interpreter`);
5. ``PR_SET_NO_NEW_PRIVS`` and a parent-death signal;
6. a Python audit hook refusing sockets, process creation, ``ctypes``, writes outside the working
   directory, reading other processes' ``/proc`` entries and signalling other processes.

The parent (:mod:`.process`) enforces the wall-clock timeout and the output cap, and kills the whole
process group (and, with a uid of its own, every process of that uid) when the run ends (:mod:`.reaper`).
"""

from .interpreter import sandbox_interpreter
from .limits import SandboxLimits
from .process import SandboxResult, run_python
from .workspace import SNIPPET_FILENAME

__all__ = ["SNIPPET_FILENAME", "SandboxLimits", "SandboxResult", "run_python", "sandbox_interpreter"]
