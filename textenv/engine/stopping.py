"""Stop detection on the newest tokens only: stop strings and EOS ids, per row."""

from __future__ import annotations

from typing import Sequence

FINISH_STOP = "stop"
FINISH_EOS = "eos"
FINISH_LENGTH = "length"


class StopChecker:
    """Decides, token by token, whether a row is finished.

    A stop string of n characters spans at most n tokens (plus two for byte-fragment tokens), so only
    that many of the newest generated tokens are decoded per check, never the whole row.

    Args:
        tokenizer: decodes the window of newest tokens.
        stop_strings: a row stops once its generated text contains any of these.
        eos_token_ids: a row stops once it generates one of these ids.
    """

    def __init__(self, tokenizer, stop_strings: Sequence[str], eos_token_ids: set[int]):
        self.tokenizer = tokenizer
        self.stop_strings = [s for s in stop_strings if s]
        self.eos_token_ids = set(eos_token_ids)
        self.window = max((len(s) for s in self.stop_strings), default=0) + 2

    def finished(self, generated: Sequence[Sequence[int]]) -> list[str | None]:
        """For each row's generated ids so far, the finish reason (`"eos"`, `"stop"`) or `None`."""
        reasons: list[str | None] = [None] * len(generated)
        to_decode = []
        for row, ids in enumerate(generated):
            if ids and ids[-1] in self.eos_token_ids:
                reasons[row] = FINISH_EOS
            elif self.stop_strings and ids:
                to_decode.append(row)
        if to_decode:
            windows = self.tokenizer.batch_decode([list(generated[row][-self.window :]) for row in to_decode], skip_special_tokens=False)
            for row, text in zip(to_decode, windows):
                if any(stop in text for stop in self.stop_strings):
                    reasons[row] = FINISH_STOP
        return reasons
