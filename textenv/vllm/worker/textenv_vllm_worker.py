"""Worker methods textenv adds to a vLLM server it starts (`--worker-extension-cls
textenv_vllm_worker.TextenvWorkerExtension`). This file is imported by vLLM in *its* environment, so it
imports nothing from textenv. Called through the server's `/collective_rpc`.
"""

from __future__ import annotations

import torch


class TextenvWorkerExtension:
    """Mixed into vLLM's worker class."""

    def textenv_reload_weights(self, weights_path: str) -> dict:
        """Reload every weight in place from the safetensors files in `weights_path`, then remake the output
        layer of a model whose output layer is tied to its input embeddings: vLLM 0.32's in-place reload
        finds no checkpoint tensor for it and puts its old kernel back, so without this a tied model keeps
        scoring tokens with the embeddings it started with (seen on the CPU backend)."""
        self.model_runner.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        return {"retied": self._textenv_retie()}

    def textenv_weights_checksum(self) -> dict:
        """Sums of the embedding and output-layer weights, to check a reload took (a test's probe)."""
        model = self.model_runner.get_model()
        head, embed = _tied_pair(model)
        return {
            "embed": float(embed.weight.double().sum()) if embed is not None else None,
            "lm_head": float(head.weight.double().sum()) if head is not None else None,
        }

    def _textenv_retie(self) -> bool:
        model = self.model_runner.get_model()
        config = getattr(getattr(self.model_runner, "model_config", None), "hf_config", None)
        if not getattr(config, "tie_word_embeddings", False):
            return False
        head, embed = _tied_pair(model)
        if head is None or embed is None or head.weight.shape != embed.weight.shape:
            return False
        with torch.no_grad():
            if head.weight.data_ptr() != embed.weight.data_ptr():
                head.weight.data.copy_(embed.weight.data)
        # The output layer's kernel (on CPU a prepacked matrix product) was made from the old tensor: remake it.
        quant_method = getattr(head, "quant_method", None)
        if quant_method is not None:
            quant_method.process_weights_after_loading(head)
        return True


def _tied_pair(model):
    head = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None) if inner is not None else None
    return head, embed
