"""Small models for fast tests and examples: random weights, the bundled model's tokenizer."""

from __future__ import annotations

import torch


def tiny_causal_lm(vocab_size: int = 49152, seed: int = 0, hidden_size: int = 32, num_layers: int = 2):
    """A randomly initialised Llama-architecture causal LM (a few hundred kB of non-embedding weights)
    with the bundled tokenizer's vocabulary size, for tests that need a real forward pass but not a
    trained model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()
