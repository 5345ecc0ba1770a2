"""Moved to `textenv.environments.verifiers_v1` (each environment kind has its module there); this name stays an alias
of that module, so code importing `textenv.gym.verifiers_v1` keeps working."""

import sys

from textenv.environments import verifiers_v1 as _moved

sys.modules[__name__] = _moved
