"""The app both fixture environments are served by: openenv's `HTTPEnvServer` with its routes, and two test-only
routes: ``GET /test/sessions`` (the sessions it holds, and the most environments alive at once since the last
``POST /test/peak``), so tests can see each episode's session closed and the concurrency a run reached."""

import os
import threading

from fastapi import FastAPI
from openenv.core.env_server.http_server import HTTPEnvServer

_lock = threading.Lock()
_alive = {"now": 0, "peak": 0}


def environment_opened() -> None:
    """Called by each fixture environment's `__init__`."""
    with _lock:
        _alive["now"] += 1
        _alive["peak"] = max(_alive["peak"], _alive["now"])


def environment_closed() -> None:
    """Called by each fixture environment's `close` (the server calls it when the session ends)."""
    with _lock:
        _alive["now"] -= 1


def make_app(environment, action_class, observation_class) -> FastAPI:
    """`environment` served with at most ``$MAX_CONCURRENT_ENVS`` sessions (the variable OpenEnv's own apps read)."""
    server = HTTPEnvServer(environment, action_class, observation_class,
                           max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "1")))
    app = FastAPI()
    server.register_routes(app)

    @app.get("/test/sessions")
    def sessions() -> dict:
        return {"active": server.active_sessions, "max": server.max_concurrent_envs, "alive": _alive["now"], "peak": _alive["peak"]}

    @app.post("/test/peak")
    def restart_peak() -> dict:
        with _lock:
            _alive["peak"] = _alive["now"]
        return dict(_alive)

    return app
