"""Legacy import path: ``from trl.core import ...`` becomes ``from textenv.core import ...``.

Everything here lives in `textenv.ppo.core` (the PPO math) and `textenv.ppo.utils` (the helpers legacy TRL kept
beside it).
"""

from textenv.ppo.core import *  # noqa: F401,F403
from textenv.ppo.core import __all__  # noqa: F401
