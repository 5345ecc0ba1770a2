"""Policies other than a model, for testing envs: `ScriptedPolicy` answers from a Python function.

A policy is any callable ``policy(contexts, stop_strings) -> list[Completion]`` taking each episode's
context token ids; `GymScheduler(policy=...)` uses it instead of the model.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import torch

from textenv.engine.engine import FINISH_EOS, Completion


class ScriptedPolicy:
    """Replies chosen by a function of the context text, ended by EOS as a chat model would.

    Args:
        tokenizer: the tokenizer (its EOS token ends every reply).
        reply (`Callable[[str], str]`): maps the decoded context (chat-template text, ending with the
            assistant's generation prompt) to the reply text.

    Attributes:
        calls (`list[int]`): the batch size of every call, in order.
    """

    def __init__(self, tokenizer, reply: Callable[[str], str]):
        self.tokenizer = tokenizer
        self.reply = reply
        self.calls: List[int] = []

    def __call__(self, contexts: Sequence[torch.Tensor], stop_strings: Sequence[str] = ()) -> List[Completion]:
        self.calls.append(len(contexts))
        return [self._complete(self.tokenizer.decode(context, skip_special_tokens=False)) for context in contexts]

    def _complete(self, context_text: str) -> Completion:
        text = self.reply(context_text) + self.tokenizer.eos_token
        ids = torch.tensor(self.tokenizer(text, add_special_tokens=False).input_ids, dtype=torch.long)
        return Completion(token_ids=ids, text=self.tokenizer.decode(ids, skip_special_tokens=False), finish_reason=FINISH_EOS)
