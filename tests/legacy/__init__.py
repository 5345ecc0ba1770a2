# TRL 0.11.4's own tests, ported to run offline against textenv (and, for comparison, against trl 0.11.4).
# This folder is a package so that `from .testing_constants import ...` works and its test modules
# (`legacy.test_ppo_trainer`, ...) do not clash with tests/test_ppo_trainer.py. See README.md.
