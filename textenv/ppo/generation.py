"""`PPOTrainer.generate`: sample responses with the policy (and the reference), as legacy TRL did."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


class PPOGenerationMixin:
    """The generation methods of [`PPOTrainer`] (uses ``accelerator``, ``model``, ``tokenizer``, ``pad_token_id``,
    ``current_device`` and ``_reference_context`` of the trainer)."""

    def generate(
        self,
        query_tensor: torch.Tensor | list[torch.Tensor],
        length_sampler: Callable[[], int] | None = None,
        batch_size: int = 4,
        return_prompt: bool = True,
        generate_ref_response: bool = False,
        **generation_kwargs,
    ):
        """Sample responses with the policy (and optionally the reference).

        Args:
            query_tensor: a 1-D tensor (returns `[1, L]`) or a list of 1-D tensors (batched with left padding;
                returns a list of 1-D tensors cut after the first generated EOS).
            length_sampler: called per batch to set ``max_new_tokens``.
            batch_size: generation batch size for a list.
            return_prompt: keep the prompt tokens in the output.
            generate_ref_response: also generate with the reference model; returns ``(response, ref_response)``.
        """
        if isinstance(query_tensor, torch.Tensor) and query_tensor.dim() != 1:
            raise ValueError(f"query_tensor must be a 1-D tensor or a list of them, got shape {tuple(query_tensor.shape)}")
        policy = self.accelerator.unwrap_model(self.model)
        response = self._generate_with(policy, query_tensor, length_sampler, batch_size, return_prompt, generation_kwargs)
        if not generate_ref_response:
            return response
        with self._reference_context() as reference:
            reference = self.accelerator.unwrap_model(reference)
            ref_response = self._generate_with(reference, query_tensor, length_sampler, batch_size, return_prompt, generation_kwargs)
        return response, ref_response

    def _generate_with(self, model, query_tensor, length_sampler, batch_size, return_prompt, generation_kwargs):
        kwargs = dict(generation_kwargs)
        if isinstance(query_tensor, torch.Tensor):
            if length_sampler is not None:
                kwargs["max_new_tokens"] = length_sampler()
            query = query_tensor.to(self.current_device).unsqueeze(0)
            output = model.generate(input_ids=query, attention_mask=torch.ones_like(query), **kwargs)
            return output if return_prompt else output[:, query.shape[1]:]
        return self._generate_batched(model, list(query_tensor), length_sampler, batch_size, return_prompt, kwargs)

    def _generate_batched(self, model, queries, length_sampler, batch_size, return_prompt, kwargs, remove_padding=True):
        eos_token_id = getattr(self.tokenizer, "eos_token_id", None)
        outputs = []
        for begin in range(0, len(queries), batch_size):
            if length_sampler is not None:
                kwargs["max_new_tokens"] = length_sampler()
            chunk = [q.to(self.current_device) for q in queries[begin : begin + batch_size]]
            width = max(len(q) for q in chunk)
            input_ids = torch.stack([F.pad(q, (width - len(q), 0), value=self.pad_token_id) for q in chunk])
            attention_mask = torch.stack([F.pad(torch.ones_like(q), (width - len(q), 0)) for q in chunk])
            kwargs.setdefault("pad_token_id", self.pad_token_id)
            generations = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            for query, generation in zip(chunk, generations):
                prompt, generated = query, generation[width:]
                if remove_padding and eos_token_id is not None and (generated == eos_token_id).any():
                    # Cut after the first EOS *generated* (a chat prompt may itself contain the EOS token).
                    generated = generated[: int((generated == eos_token_id).nonzero()[0, 0]) + 1]
                outputs.append(torch.cat([prompt, generated]) if return_prompt else generated)
        return outputs

