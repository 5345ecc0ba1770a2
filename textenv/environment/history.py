"""TextHistory: one episode as text segments with the exact tokens behind them and a training mask."""

from __future__ import annotations

from typing import Any

import torch


class TextHistory:
    """The record of one episode: a prompt segment followed by model and system (tool) segments.

    Each segment keeps its text, the exact token ids behind it and whether the model wrote it. Token
    masks are 1 on tokens the model generated (trained on) and 0 on prompt and tool tokens.

    Args:
        text (`str`): the first segment's text (normally prompt + query).
        tokens (`torch.LongTensor`): its token ids, 1-D.
        system (`bool`, defaults to `True`): whether the first segment is system text (mask 0).

    Attributes:
        text (`str`): all segments' text, concatenated.
        tokens (`torch.LongTensor`): all segments' token ids, concatenated, 1-D.
        token_masks (`torch.LongTensor`): 1 for model tokens, 0 otherwise; same length as `tokens`.
        token_logprobs (`torch.FloatTensor`): the log-probability the inference engine gave each token when
            it sampled it, same length as `tokens`; NaN where unknown (system tokens, or a model segment
            appended without `logprobs`).
        text_spans (`list[tuple[int, int]]`): each segment's `(start, end)` character offsets in `text`.
        token_spans (`list[tuple[int, int]]`): each segment's `(start, end)` offsets in `tokens`.
        system_spans (`list[bool]`): for each segment, whether it is system text.
        segment_policy_versions (`list[int | None]`): for each segment, the version of the weights that wrote
            it (`Completion.policy_version`; `None` for system text and outside a training loop).
        completed (`bool`): the episode is over.
        truncated (`bool`): it ended by a limit (`max_length`, `max_turns`) rather than by the model.
        reward: what the reward function returned for this episode (`0.0` until computed).
    """

    prompt_color = "black on grey85"
    system_color = "black on cyan3"
    model_color = "black on deep_sky_blue1"
    reward_color = "black on plum1"

    def __init__(self, text: str, tokens: torch.Tensor, system: bool = True):
        tokens = _as_token_tensor(tokens)
        self.system_spans: list[bool] = []
        self.text_spans: list[tuple[int, int]] = []
        self.token_spans: list[tuple[int, int]] = []
        self.segment_policy_versions: list[int | None] = []
        self.token_masks = torch.empty(0, dtype=torch.long, device=tokens.device)
        self.token_logprobs = torch.empty(0, dtype=torch.float, device=tokens.device)
        self.text = ""
        self.tokens = torch.empty(0, dtype=torch.long, device=tokens.device)
        self.completed = False
        self.truncated = False
        self.reward: Any = 0.0
        self.info: dict[str, Any] = {}
        self.append_segment(text, tokens, system=system)

    def append_segment(self, text: str, tokens: torch.Tensor, system: bool = True, logprobs: Any = None,
                       policy_version: int | None = None) -> None:
        """Append a segment.

        Args:
            text (`str`): the segment's text.
            tokens (`torch.LongTensor`): its exact token ids, 1-D.
            system (`bool`, defaults to `True`): system text (mask 0) or model output (mask 1).
            logprobs (`torch.FloatTensor`, *optional*): the engine's log-probability of each of `tokens` when
                it sampled them (`Completion.logprobs`), 1-D; stored in `token_logprobs` (NaN when `None`).
            policy_version (`int`, *optional*): the version of the weights that wrote a model segment
                (`Completion.policy_version`); stored in `segment_policy_versions`.

        Raises:
            ValueError: the text or the token list is empty, or `logprobs` is not 1-D of `len(tokens)`.
        """
        tokens = _as_token_tensor(tokens)
        if len(text) == 0 or len(tokens) == 0:
            raise ValueError("Can't append empty text or token list to history.")
        tokens = tokens.to(self.tokens.device)
        segment_logprobs = _as_logprob_tensor(logprobs, len(tokens)).to(self.tokens.device)
        text_start, token_start = len(self.text), len(self.tokens)
        self.text += text
        self.text_spans.append((text_start, len(self.text)))
        self.system_spans.append(system)
        self.segment_policy_versions.append(policy_version)
        self.tokens = torch.cat((self.tokens, tokens))
        segment_mask = torch.zeros_like(tokens) if system else torch.ones_like(tokens)
        self.token_masks = torch.cat((self.token_masks, segment_mask))
        self.token_logprobs = torch.cat((self.token_logprobs, segment_logprobs))
        self.token_spans.append((token_start, len(self.tokens)))

    def complete(self, truncated: bool = False) -> None:
        """Mark the episode as over; `truncated` says whether a limit, not the model, ended it."""
        self.completed = True
        self.truncated = truncated

    @property
    def last_text_segment(self) -> str:
        """The text of the last segment."""
        start, end = self.text_spans[-1]
        return self.text[start:end]

    @property
    def last_model_segment(self) -> str | None:
        """The text of the last segment the model wrote, or `None` if it wrote none yet."""
        for (start, end), system in zip(reversed(self.text_spans), reversed(self.system_spans)):
            if not system:
                return self.text[start:end]
        return None

    def split_query_response_tokens(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split into what `PPOTrainer.step` takes.

        Returns:
            `(query, response, mask)`: the first segment's tokens, all later tokens, and the mask of the
            later tokens (1 = model token).
        """
        split = self.token_spans[0][1]
        return self.tokens[:split], self.tokens[split:], self.token_masks[split:]

    @property
    def policy_versions(self) -> list[int | None]:
        """The version of the weights behind each model segment, in order (a multi-turn episode may span updates)."""
        return [version for version, system in zip(self.segment_policy_versions, self.system_spans) if not system]

    def response_logprobs(self) -> torch.Tensor:
        """The engine's log-probabilities of the response tokens of `split_query_response_tokens()` (same
        length as its response; NaN where unknown), e.g. `rollout_logprobs` for `PPOTrainer.step`."""
        return self.token_logprobs[self.token_spans[0][1] :]

    # Rendering lives in its own module; these are the legacy entry points.
    def show_text(self, show_legend: bool = False, console=None) -> None:
        """Print the text, coloured by segment kind (prompt, system, model), then the reward."""
        from textenv.environment.rendering import print_renderable, text_view

        print_renderable(text_view(self), console)
        if show_legend:
            self.show_colour_legend(console)

    def show_tokens(self, tokenizer, show_legend: bool = False, console=None) -> None:
        """Print every token as the tokenizer spells it, coloured by segment kind, then the reward."""
        from textenv.environment.rendering import print_renderable, tokens_view

        print_renderable(tokens_view(self, tokenizer), console)
        if show_legend:
            self.show_colour_legend(console)

    def show_colour_legend(self, console=None) -> None:
        """Print which colour stands for prompt, system, model and reward."""
        from textenv.environment.rendering import legend_view, print_renderable

        print_renderable(legend_view(self), console)

    def _repr_html_(self) -> str:
        from textenv.environment.rendering import to_html, text_view

        return to_html(text_view(self))

    def __repr__(self) -> str:
        return (
            f"TextHistory(segments={len(self.text_spans)}, tokens={len(self.tokens)}, "
            f"model_tokens={int(self.token_masks.sum())}, completed={self.completed}, "
            f"truncated={self.truncated}, reward={self.reward!r})"
        )


def _as_logprob_tensor(logprobs: Any, length: int) -> torch.Tensor:
    """`logprobs` as a 1-D float tensor of `length` (all NaN for `None`)."""
    if logprobs is None:
        return torch.full((length,), float("nan"))
    if not isinstance(logprobs, torch.Tensor):
        logprobs = torch.as_tensor(list(logprobs), dtype=torch.float)
    logprobs = logprobs.detach().float()
    if logprobs.dim() != 1 or len(logprobs) != length:
        raise ValueError(
            f"logprobs must be a 1-D tensor with one log-probability per token of the segment ({length}), "
            f"got shape {tuple(logprobs.shape)}."
        )
    return logprobs


def _as_token_tensor(tokens: Any) -> torch.Tensor:
    if not isinstance(tokens, torch.Tensor):
        tokens = torch.as_tensor(list(tokens), dtype=torch.long)
    if tokens.dim() == 2 and tokens.shape[0] == 1:
        tokens = tokens[0]
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be a 1-D tensor of token ids, got shape {tuple(tokens.shape)}.")
    return tokens
