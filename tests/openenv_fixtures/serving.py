"""A fixture app served by hand for the tests that need its URL, as `OpenEnvEnvironments` serves an app (textenv's
`OpenEnvServer`, whose PYTHONPATH is the test process's path, where pytest put tests/), and stopped after."""

import asyncio
from contextlib import contextmanager
from typing import Iterator

from textenv.environments.openenv_server import OpenEnvServer


@contextmanager
def served(app: str, max_sessions: int) -> Iterator[OpenEnvServer]:
    server = OpenEnvServer(app, max_sessions=max_sessions)
    server.launch()
    try:
        asyncio.run(server.wait_until_ready())
        yield server
    finally:
        server.stop()
