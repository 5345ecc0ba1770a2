"""Moved to `textenv.environments.verifiers` (each environment kind has its module there); this name stays an alias
of that module, so code importing `textenv.gym.verifiers_envs` keeps working."""

import sys

from textenv.environments import verifiers as _moved

sys.modules[__name__] = _moved
