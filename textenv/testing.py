"""Small models for fast tests: `tiny_causal_lm` (random weights, the bundled model's vocabulary), kept
here under its old import path for the tests; it lives in `textenv.models`."""

from textenv.models import tiny_causal_lm

__all__ = ["tiny_causal_lm"]
