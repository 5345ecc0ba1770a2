"""An OpenEnv environment's server as a local process: what `OpenEnvEnvironments.serving` starts and stops.

`OpenEnvServer` runs the environment's FastAPI app (``module:attribute``, e.g. ``echo_env.server.app:app``, what
``uvicorn`` or ``openenv serve`` would run) under uvicorn in a process of its own, with this Python interpreter:
no Docker and no container. The listening socket is bound here, on a free port of 127.0.0.1, and handed to the
process, so no other program can take the port between choosing it and serving on it. The process gets
``MAX_CONCURRENT_ENVS`` (the session cap OpenEnv's own apps read) and a ``PYTHONPATH`` through which it imports what
this process imports. It runs in a session of its own (a terminal's Ctrl-C reaches textenv, which stops it), and it
stops itself when the process that started it is gone. Its output goes to a log file whose last lines an error
quotes.

``python -m textenv.environments.openenv_server APP --fd N`` is that process. openenv's own runtime providers start
a Docker container, a `uv` project or a cloud sandbox; none runs an installed app in this interpreter, hence this one.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Optional

LOG_TAIL_LINES = 20
STOP_GRACE_SECONDS = 10.0  # how long the server may take to stop on SIGTERM before it is killed
POLL_SECONDS = 0.2


class ServerStartError(RuntimeError):
    """The environment's server exited, or did not answer in time, before it served."""


class OpenEnvServer:
    """One OpenEnv app served by uvicorn in a local process.

    Args:
        app (`str`): the FastAPI app, ``module:attribute`` (``module`` alone means ``module:app``).
        max_sessions (`int`): the session cap, passed as ``MAX_CONCURRENT_ENVS``.
        start_timeout (`float`): seconds the server may take to answer ``GET /health``.

    Attributes:
        url (`str`): ``http://127.0.0.1:PORT`` (after `launch`).
        process (`subprocess.Popen`): the server process (after `launch`).
    """

    def __init__(self, app: str, *, max_sessions: int, start_timeout: float = 120.0):
        self.app = app
        self.max_sessions = max_sessions
        self.start_timeout = start_timeout
        self.url: Optional[str] = None
        self.process: Optional[subprocess.Popen] = None
        self.log_path: Optional[str] = None

    def launch(self) -> str:
        """Start the process (it imports and serves the app in the background); returns its URL."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind(("127.0.0.1", 0))
            listener.listen(128)
            descriptor, log = listener.fileno(), tempfile.NamedTemporaryFile(prefix="textenv-openenv-", suffix=".log", delete=False)
            self.log_path = log.name
            with log:
                command = [sys.executable, "-m", "textenv.environments.openenv_server", self.app, "--fd", str(descriptor)]
                self.process = subprocess.Popen(command, pass_fds=[descriptor], stdin=subprocess.DEVNULL, stdout=log,
                                                stderr=subprocess.STDOUT, env=self._environment(), start_new_session=True)
            self.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        finally:
            listener.close()  # the process holds its own copy
        return self.url

    def _environment(self) -> dict:
        inherited = [path for path in sys.path if path]
        existing = os.environ.get("PYTHONPATH")
        return {**os.environ, "MAX_CONCURRENT_ENVS": str(self.max_sessions), "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(inherited + ([existing] if existing else []))}

    async def wait_until_ready(self) -> None:
        """Return once ``GET /health`` answers 200.

        Raises:
            ServerStartError: the process exited first, or `start_timeout` passed (the server is then stopped);
                the message quotes the log's last lines.
        """
        import httpx

        deadline = time.monotonic() + self.start_timeout
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:  # a local server: no proxy
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise ServerStartError(f"the OpenEnv server for {self.app!r} exited with code {self.process.returncode} "
                                           f"before it served; the last lines of its log:\n{self.log_tail()}")
                try:
                    if (await client.get(f"{self.url}/health")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(POLL_SECONDS)
        tail = self.log_tail()
        self.stop()
        raise ServerStartError(f"the OpenEnv server for {self.app!r} did not answer GET /health within {self.start_timeout:g} s "
                               f"(start_timeout); the last lines of its log:\n{tail}")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last `lines` lines of the server's output."""
        if self.log_path is None or not os.path.exists(self.log_path):
            return "(no log)"
        with open(self.log_path, errors="replace") as log:
            return "".join(log.readlines()[-lines:]).rstrip() or "(the log is empty)"

    def stop(self) -> None:
        """Stop the process and whatever it started (its process group): SIGTERM, then SIGKILL after
        `STOP_GRACE_SECONDS`. Blocking and idempotent, so that it completes even while a run is being cancelled."""
        if self.process is not None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait()
            _signal_group(self.process.pid, signal.SIGKILL)  # anything the server started and left behind
        if self.log_path is not None and os.path.exists(self.log_path):
            os.unlink(self.log_path)
        self.log_path = None


def _signal_group(group: int, number: int) -> None:
    try:
        os.killpg(group, number)
    except ProcessLookupError:
        pass


def _stop_when_orphaned(parent: int) -> None:
    """A daemon thread that ends this server (SIGTERM, uvicorn's own graceful stop) once `parent` is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="textenv-openenv-parent-watch", daemon=True).start()


def main(argv: Optional[List[str]] = None) -> None:
    """Serve ``APP`` on the listening socket ``--fd`` (see the module docstring)."""
    import uvicorn

    parser = argparse.ArgumentParser(description="Serve an OpenEnv environment's app on a socket textenv bound.")
    parser.add_argument("app", help="module:attribute of the FastAPI app")
    parser.add_argument("--fd", type=int, required=True, help="the listening socket's file descriptor")
    args = parser.parse_args(argv)
    _stop_when_orphaned(os.getppid())
    module, _, attribute = args.app.partition(":")
    application = getattr(importlib.import_module(module), attribute or "app")
    listener = socket.socket(fileno=args.fd)
    uvicorn.Server(uvicorn.Config(application, log_level="info")).run(sockets=[listener])


if __name__ == "__main__":
    main()
