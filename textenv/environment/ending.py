"""How a TextEnvironment decides an episode is over, and scores the episodes: the legacy methods
`task_end_check`, `tasks_end_check` and `compute_reward` (subclasses may override them)."""

from __future__ import annotations

from textenv.environment.history import TextHistory


class EndingAndRewards:
    """`TextEnvironment`'s end checks and rewards; it reads `max_length`, `tokenizer`, the tag tokens and
    `reward_fn` from the environment."""

    def task_end_check(self, history: TextHistory, model_turn: bool = True) -> tuple[bool, bool]:
        """Whether an episode is over.

        Returns:
            `(truncated, ended)`: `max_length` exceeded gives `(True, True)`; EOS in the model's last
            segment, a model turn without a tool call, or `<submit>` give `(False, True)`.
        """
        if history.completed:
            return False, False
        if self.max_length is not None and len(history.tokens) > self.max_length:
            return True, True
        if self._model_wrote_eos(history):
            return False, True
        last_segment = history.last_text_segment
        called_tool = self.request_token in last_segment and self.call_token in last_segment
        if model_turn and not (called_tool or self.submit_token in last_segment):
            return False, True
        if self.submit_token in last_segment:
            return False, True
        return False, False

    def _model_wrote_eos(self, history: TextHistory) -> bool:
        # Only the model's own last segment counts: a chat-template prompt contains the EOS string too.
        if history.system_spans[-1] or self.tokenizer.eos_token_id is None:
            return False
        start, end = history.token_spans[-1]
        return bool((history.tokens[start:end] == self.tokenizer.eos_token_id).any())

    def tasks_end_check(self, histories: list[TextHistory], model_turn: bool = True) -> list[TextHistory]:
        """Apply `task_end_check` to every history and complete the ended ones; returns the same list."""
        for history in histories:
            truncated, ended = self.task_end_check(history, model_turn=model_turn)
            if ended:
                history.complete(truncated=truncated)
        return histories

    def compute_reward(self, histories: list[TextHistory], **reward_kwargs) -> list[TextHistory]:
        """Call `reward_fn` once on every history's last text segment and store the rewards."""
        if self.reward_fn is None:
            return histories
        rewards = self.reward_fn([history.last_text_segment for history in histories], **reward_kwargs)
        rewards = list(rewards)
        if len(rewards) != len(histories):
            raise ValueError(
                f"reward_fn returned {len(rewards)} rewards for {len(histories)} episodes; it must return "
                "one reward per entry of the list it is given."
            )
        for history, reward in zip(histories, rewards):
            history.reward = reward
        return histories
