"""What this machine's CPU runs well, in one place: the kernels ATen dispatches to, whether bfloat16 is native,
and which dtype a vLLM server on this CPU should run in.

On a CPU without native bf16 (no AVX-512 BF16 or AMX on x86, no BF16 extension on Arm) bfloat16 is emulated
with float32 arithmetic plus conversions, and it is slower than float32 itself: a Gym workload on a vLLM server
in bf16 took 2.9-3.8x the time of a naive per-turn transformers loop in float32 on an AVX2-only AMD EPYC,
whereas on an AVX-512 BF16 CPU the same server in bf16 ran 3.9x faster than that loop. textenv therefore
serves in float32 on such a CPU unless bf16 is asked for by name, and says so once when it is.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# What emulated bf16 cost on the AVX2-only AMD EPYC above: benchmarks/run.py's gym workload on a vLLM server, and
# a forward pass of the bundled model under bf16 autocast against float32 (numbers below).
BF16_EMULATED_COST = (
    "measured on an AVX2-only AMD EPYC: a vLLM server in bf16 took 2.9-3.8x the time of a float32 transformers "
    "loop on a Gym workload, and a forward pass of the bundled model under bf16 autocast {autocast_cost} float32"
)
# Medians of interleaved A/B runs, torch 2.13, 2-core machine shared with other jobs (so the spread is wide):
# a decoding step (8 rows, 64 cached tokens) 1.6x on 1 thread (472 against 297 ms), 6.7x on 2 (838 against 126 ms);
# a 4x64-token prefill 7.2x on 1 thread (8.1 against 1.1 s), 2.0x on 2; an 8x128 prefill 3.5x on 2 (43 against 12 s).
AUTOCAST_COST = "took 1.6-7.2x the time of"
_warned: set[str] = set()


@dataclass(frozen=True)
class CPUFacts:
    """What the CPU of this process offers.

    Args:
        name (`str`): the CPU's model name (`/proc/cpuinfo`), or the machine type where it has none.
        kernel_level (`str`): the vector kernels ATen dispatches to (`torch.backends.cpu.get_cpu_capability()`:
            `"AVX2"`, `"AVX512"`, `"DEFAULT"`, ...). `ATEN_CPU_CAPABILITY` can force a level the CPU lacks.
        vector_flags (`tuple[str, ...]`): the CPU's own vector flags that matter here (`avx2`, `avx512f`,
            `avx512_bf16`, `amx_bf16`, Arm's `bf16`, ...), read from the CPU, not from torch.
        bf16_native (`bool` or `None`): whether the CPU computes in bfloat16 natively; `None`: unknown.
    """

    name: str
    kernel_level: str
    vector_flags: tuple[str, ...]
    bf16_native: bool | None

    def describe(self) -> str:
        """One line for logs and benchmark tables, e.g. ``"AMD EPYC (avx2), kernels AVX2, bf16 emulated"``."""
        flags = ", ".join(self.vector_flags) or "no vector flags found"
        bf16 = {True: "bf16 native", False: "bf16 emulated", None: "bf16 support unknown"}[self.bf16_native]
        forced = os.environ.get("ATEN_CPU_CAPABILITY")
        kernels = f"kernels {self.kernel_level}" + (f" (forced: ATEN_CPU_CAPABILITY={forced})" if forced else "")
        return f"{self.name} ({flags}), {kernels}, {bf16}"


@functools.lru_cache(maxsize=None)
def cpu_facts() -> CPUFacts:
    """The `CPUFacts` of this machine (read once per process)."""
    import torch

    flags = _cpuinfo_flags()
    vector_flags = tuple(flag for flag in _VECTOR_FLAGS if flag in flags)
    return CPUFacts(_cpu_name(), torch.backends.cpu.get_cpu_capability(), vector_flags, _bf16_native(flags))


def describe_cpu() -> str:
    """`cpu_facts().describe()`: the CPU, its kernel level and bf16 nativeness in one line."""
    return cpu_facts().describe()


_VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "asimd", "sve", "bf16")


def _cpuinfo_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 `flags`, Arm `Features`); empty where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _bf16_native(flags: set[str]) -> bool | None:
    """torch's own probe on x86 (AVX-512 BF16 or AMX tiles), the CPU's flags where torch has none (Arm's `bf16`,
    an older torch), `None` where neither says."""
    import torch

    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if platform.machine().lower() in ("x86_64", "amd64", "i686") and all(probes):
        return any(probe() for probe in probes)
    if flags:
        return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    _warn_once("bf16-unknown", "Cannot tell whether this CPU has native bf16 (no torch probe for %s, no /proc/cpuinfo flags): "
               "treating bf16 as emulated.", platform.machine())
    return None


# ------------------------------------------------------------------------------ dtype choices
@dataclass(frozen=True)
class DtypeChoice:
    """A server dtype and why: `dtype` is what to pass as vLLM's `--dtype`, `reason` says why, for the logs."""

    dtype: str
    reason: str


def cuda_visible() -> bool:
    """Whether this process sees a CUDA device (a server it starts would then run on it)."""
    import torch

    return torch.cuda.is_available()


def resolve_server_dtype(requested: str | None) -> DtypeChoice:
    """The `--dtype` of a vLLM server this process starts, for the device it will run on.

    On a GPU, `"auto"` (or `None`) stays `"auto"`. On a CPU without native bf16, `"auto"` becomes `"float32"`
    (vLLM's CPU backend would otherwise run a float32 model in bfloat16, emulated here and slower); with native
    bf16 it stays `"auto"` (vLLM then picks bfloat16). An explicit dtype is kept; an explicit bfloat16 on a CPU
    that emulates it is warned about once, with its measured cost.

    Args:
        requested (`str`, *optional*): the dtype asked for (`"auto"`, `"float32"`, `"bfloat16"`, ...); `None` is `"auto"`.

    Returns:
        `DtypeChoice`: the dtype to pass and the reason.
    """
    requested = requested or "auto"
    if requested not in ("auto", "bfloat16"):
        return DtypeChoice(requested, f"--dtype {requested} as asked")
    if cuda_visible():
        return DtypeChoice(requested, f"--dtype {requested} on the GPU")
    facts = cpu_facts()
    cpu = facts.describe()
    if requested == "auto":
        if facts.bf16_native:
            return DtypeChoice("auto", f"--dtype auto: this CPU has native bf16 ({cpu}), so vLLM runs the model in bfloat16")
        return DtypeChoice("float32", f"--dtype float32 instead of auto: this CPU has no native bf16 ({cpu}), which vLLM's "
                                      "auto would pick for a float32 model; bf16 " + bf16_cost())
    warn_if_bf16_emulated("a vLLM server in bfloat16")
    return DtypeChoice(requested, f"--dtype {requested} as asked ({cpu})")


def bf16_cost() -> str:
    """What emulated bf16 costs, as measured (for warnings and reasons)."""
    return BF16_EMULATED_COST.format(autocast_cost=AUTOCAST_COST)


def warn_if_bf16_emulated(what: str) -> bool:
    """Warn once per `what` (e.g. ``"bf16 autocast decoding"``) when this CPU emulates bf16; return whether it does."""
    facts = cpu_facts()
    if facts.bf16_native:
        return False
    _warn_once(what, "This CPU has no native bf16 (%s): %s is slower than float32 here; bf16 %s. Use float32 on "
               "this CPU unless you need bf16's numerics.", facts.describe(), what, bf16_cost())
    return True


def _warn_once(key: str, message: str, *args) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)
