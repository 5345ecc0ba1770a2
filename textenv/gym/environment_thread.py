"""Moved to `textenv.environments.environment_thread` (each environment kind has its module there); this name stays an alias
of that module, so code importing `textenv.gym.environment_thread` keeps working."""

import sys

from textenv.environments import environment_thread as _moved

sys.modules[__name__] = _moved
