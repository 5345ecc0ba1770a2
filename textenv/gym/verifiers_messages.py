"""Moved to `textenv.environments.verifiers_messages` (each environment kind has its module there); this name stays an alias
of that module, so code importing `textenv.gym.verifiers_messages` keeps working."""

import sys

from textenv.environments import verifiers_messages as _moved

sys.modules[__name__] = _moved
