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

    def textenv_load_shared_weights(self, segment: str, index: list) -> dict:
        """Load weights from the shared-memory block `segment` (no file, no serialisation) in place, then remake a
        tied output layer as `textenv_reload_weights` does. For vLLM in the training process (colocate mode).

        Args:
            segment: the name of a `multiprocessing.shared_memory` block the trainer wrote the tensors into.
            index: `[(checkpoint name, dtype name, shape, byte offset), ...]` of the tensors in it.
        """
        from multiprocessing import resource_tracker, shared_memory

        block = shared_memory.SharedMemory(name=segment)
        resource_tracker.unregister(block._name, "shared_memory")  # the trainer owns (and unlinks) it
        try:
            views = ((name, _view(block.buf, dtype, shape, offset)) for name, dtype, shape, offset in index)
            self.model_runner.reload_weights(weights_iterator=views, is_checkpoint_format=True)
        finally:
            views = None
            try:
                block.close()
            except BufferError:  # a view is still referenced somewhere: the mapping goes when it is collected
                pass
        return {"loaded": len(index), "retied": self._textenv_retie()}

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


def _view(buffer, dtype: str, shape: list, offset: int) -> torch.Tensor:
    """A tensor viewing `shape` elements of `dtype` at byte `offset` of `buffer` (no copy)."""
    count = 1
    for size in shape:
        count *= size
    return torch.frombuffer(buffer, dtype=getattr(torch, dtype), count=count, offset=offset).reshape(shape)


def _tied_pair(model):
    head = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None) if inner is not None else None
    return head, embed
