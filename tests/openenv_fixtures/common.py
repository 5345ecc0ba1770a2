"""The app both fixture environments are served by: openenv's `HTTPEnvServer` with its routes, and two test-only
routes: ``GET /test/sessions`` (the sessions it holds, and, since the last ``POST /test/peak``, the most
environments alive at once and the secrets its resets were given), so tests can see each episode's session closed, the
concurrency a run reached and the rows' columns reaching reset (on any openenv: openenv-core 0.3 sends no
observation metadata)."""

import os
import threading

from fastapi import FastAPI
from openenv.core.env_server.http_server import HTTPEnvServer

_lock = threading.Lock()
_alive = {"now": 0, "peak": 0}
_secrets: list = []
EVENTS = "OPENENV_FIXTURE_EVENTS"  # where set: the file each environment's opening and closing (and the server's
# process id) is appended to


def _record(event: str) -> None:
    """For tests that outlive the server (a process interrupted with its server): its events in a file."""
    if os.environ.get(EVENTS):
        with open(os.environ[EVENTS], "a") as events:
            events.write(f"{event} {os.getpid()}\n")


def environment_opened() -> None:
    """Called by each fixture environment's `__init__`."""
    with _lock:
        _alive["now"] += 1
        _alive["peak"] = max(_alive["peak"], _alive["now"])
    _record("opened")


def environment_closed() -> None:
    """Called by each fixture environment's `close` (the server calls it when the session ends)."""
    with _lock:
        _alive["now"] -= 1
    _record("closed")


def reset_seen(secret) -> None:
    """Called by each fixture environment's `reset` with the secret it plays."""
    with _lock:
        _secrets.append(secret)


def make_app(environment, action_class, observation_class) -> FastAPI:
    """`environment` served with at most ``$MAX_CONCURRENT_ENVS`` sessions (the variable OpenEnv's own apps read)."""
    server = HTTPEnvServer(environment, action_class, observation_class,
                           max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "1")))
    app = FastAPI()
    server.register_routes(app)

    @app.get("/test/sessions")
    def sessions() -> dict:
        return {"active": server.active_sessions, "max": server.max_concurrent_envs, "alive": _alive["now"], "peak": _alive["peak"],
                "secrets": list(_secrets)}

    @app.post("/test/peak")
    def restart_peak() -> dict:
        with _lock:
            _alive["peak"] = _alive["now"]
            _secrets.clear()
        return dict(_alive)

    return app
