"""The engine interface, its entry and its in-process backends, shared by every front end.

- `interface`: `Engine`, the contract every backend keeps (turns from exact ids, stop strings, exact ids and
  log-probs back, the model's current weights, the path reported); `Completion`, what a turn returns;
- `backends`: `build_engine`, the engine entry: `"textenv"` (the in-process `GenerationEngine`, the default),
  `"transformers"` (`TransformersEngine`), `"vllm"` (`textenv.vllm.VLLMEngine`, on servers or colocated) or
  `"auto"` (`auto_engine`, by device);
- `engine`: `GenerationEngine` (also `RolloutEngine`), the front door of textenv's engine: every episode's next
  turn through ``await generate(context_ids, stop_strings, generation_kwargs, episode=key)``;
- `scheduler`: `RequestScheduler`, the waiting requests and what to admit at each step;
- `worker`: the decoding thread (`serve`) and hosting it in the caller's thread (`run_hosted`);
- `transformers_cb`: `TransformersEngine`, the interface on transformers' continuous batching;
- `decoding`: `ContinuousDecoder`, the decoding loop: rows join and leave the batch at every step;
- `prefix_cache`: `PrefixCache`, KV caches kept per episode and for shared prompt prefixes, keyed by token ids;
- `kv_cache`: `GrowingLayer` / `growing_cache`, a KV cache that appends in place;
- `fast_path`: `decoding_path`, whether the engine's own loop can serve a model (found by a probe);
- `hf_generate`: the fallback through transformers' `generate`, for settings the loop does not implement;
- `sampling`: `SamplingSettings` and `RandomStream`: greedy or sampled token choice as `generate` makes it;
- `stopping`: `StopChecker`, stop strings and EOS ids per row;
- `precision`: autocast dtypes and the decoding loop's autocast;
- `unwrapping`: `unwrap_model`, `decoding_model`: the model inside accelerate, value-head and PEFT wrappers.

May import: textenv.asyncio_bridge, textenv.hardware, textenv.padding, textenv.transformers_compat, textenv.vllm (build_engine's vLLM backend, imported inside functions; a cycle)
"""

import textenv.transformers_compat  # noqa: F401  (before anything reads transformers' modules)
from textenv.engine.engine import GenerationEngine, RolloutEngine, unwrap_model
from textenv.engine.interface import Completion, Engine

__all__ = ["Completion", "Engine", "GenerationEngine", "RolloutEngine", "unwrap_model"]
