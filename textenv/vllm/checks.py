"""Refuse a vLLM server that serves another model or tokenizer than the trainer's, before any episode runs."""

from __future__ import annotations

import torch

from textenv.vllm.client import VLLMServerError

# Text whose tokens exercise the chat markers, digits, spaces and punctuation.
PROBE_MESSAGES = [{"role": "user", "content": "What is 17 * 23? Use the calculator, then answer in one line."}]
PROBE_TEXT = "The capital of France is Paris. 17 * 23 = 391; <request><Calculator>2+2<call>4<response>"
# Mean absolute difference of the probe's token log-probabilities, in nats, above which the models differ.
# Float32 against bfloat16 of the same weights stays well under it; another model is far above.
LOGPROB_TOLERANCE = 0.25


def check_served_model(client, model, tokenizer, synced: bool, tolerance: float = LOGPROB_TOLERANCE) -> float:
    """Raise `VLLMServerError` when the server at `client.url` tokenizes differently from `tokenizer`, or
    when its model's log-probabilities on a probe differ from `model`'s; returns the mean difference.

    Args:
        synced (`bool`): the trainer's weights were just sent (a difference then means the sync failed).
    """
    probe = _probe_ids(tokenizer)
    served_ids = client.tokenize(tokenizer.decode(probe, skip_special_tokens=False))
    if served_ids != probe:
        raise VLLMServerError(
            f"The vLLM server at {client.url} serves {client.model!r}, whose tokenizer differs from the trainer's "
            f"(probe text gives {len(served_ids)} ids there, {len(probe)} here; first difference at id "
            f"{_first_difference(served_ids, probe)}). Start the server with the policy's model folder."
        )
    served = torch.tensor(client.prompt_logprobs(probe))
    local = local_logprobs(model, probe)
    difference = float((served - local).abs().mean())
    if not difference <= tolerance:
        cause = "the weights just sent did not take" if synced else "it serves another model (or other weights)"
        raise VLLMServerError(
            f"The vLLM server at {client.url} serves {client.model!r}, whose log-probabilities on a probe text differ "
            f"from the trainer's model by {difference:.3f} nats per token on average (tolerance {tolerance}): {cause}. "
            "Start it with the policy's model folder (`textenv serve --model PATH`)."
        )
    return difference


def local_logprobs(model, token_ids: list[int]) -> torch.Tensor:
    """The log-probability of each id of `token_ids` after the ones before it, under `model` (float32)."""
    device = next(model.parameters()).device
    ids = torch.tensor([token_ids], device=device)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0].cpu()


def _probe_ids(tokenizer) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(PROBE_MESSAGES, tokenize=False, add_generation_prompt=True)
        text = rendered + PROBE_TEXT
    else:
        text = PROBE_TEXT
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((index for index, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
