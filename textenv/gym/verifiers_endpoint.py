"""Moved to `textenv.environments.verifiers_endpoint` (each environment kind has its module there); this name stays an alias
of that module, so code importing `textenv.gym.verifiers_endpoint` keeps working."""

import sys

from textenv.environments import verifiers_endpoint as _moved

sys.modules[__name__] = _moved
