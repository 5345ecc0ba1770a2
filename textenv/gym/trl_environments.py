"""Moved to `textenv.environments.trl` (each environment kind has its module there); this name stays an alias
of that module, so code importing `textenv.gym.trl_environments` keeps working."""

import sys

from textenv.environments import trl as _moved

sys.modules[__name__] = _moved
