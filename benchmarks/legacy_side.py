"""The legacy side of the benchmark: trl 0.11.4 `TextEnvironment` and `PPOTrainer.step` on
transformers 4.46.3. Run by the legacy venv's python (see `legacy_venv.py`); prints one JSON line.

The bundled model folder was written by transformers 5, so two things are adapted for 4.46: the RoPE base
is read from `rope_parameters` (4.46 reads `rope_theta` and would silently fall back to 10000), and the
tokenizer is built from `tokenizer.json` directly (4.46 does not know the `TokenizersBackend` class).
With these, both stacks compute bit-identical logits for the same ids.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch

import workload

warnings.filterwarnings("ignore")


def load_tokenizer(model_path: str):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=str(Path(model_path) / "tokenizer.json"),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )


def load_value_head_model(model_path: str, **value_head_kwargs):
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl import AutoModelForCausalLMWithValueHead

    config = AutoConfig.from_pretrained(model_path)
    rope = getattr(config, "rope_parameters", None) or {}
    if "rope_theta" in rope:
        config.rope_theta = rope["rope_theta"]
    base = AutoModelForCausalLM.from_pretrained(model_path, config=config, torch_dtype=torch.float32)
    return AutoModelForCausalLMWithValueHead.from_pretrained(base, **value_head_kwargs)


def warm_up(model, tokenizer) -> None:
    ids = tokenizer("What is 1+1?", return_tensors="pt").input_ids
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, pad_token_id=tokenizer.eos_token_id)


def run_rollout(inputs: dict, max_turns_list: list[int]) -> dict:
    from trl import TextEnvironment

    tokenizer = load_tokenizer(inputs["model_path"])
    model = load_value_head_model(inputs["model_path"]).eval()
    warm_up(model, tokenizer)
    runs = []
    for max_turns in max_turns_list:
        env = TextEnvironment(
            model,
            tokenizer,
            {workload.TOOL_NAME: workload.simple_calculator},
            workload.exact_match_reward,
            inputs["prompt"],
            max_turns=max_turns,
            generation_kwargs=workload.greedy_generation_kwargs(inputs["max_new_tokens"], tokenizer.eos_token_id),
        )
        runs.append(workload.timed_run(env, inputs))
    return {"runs": runs, "peak_rss_mb": workload.peak_rss_mb()}


def run_ppo_step(inputs: dict) -> dict:
    from trl import PPOConfig, PPOTrainer

    batch = workload.read_json(inputs["batch_path"])
    tokenizer = load_tokenizer(inputs["model_path"])
    model = load_value_head_model(inputs["model_path"], summary_dropout_prob=0.0)
    model.v_head.load_state_dict(torch.load(inputs["value_head_path"]))
    config = PPOConfig(batch_size=len(batch["queries"]), mini_batch_size=inputs["mini_batch_size"], seed=0)
    trainer = PPOTrainer(config, model, ref_model=None, tokenizer=tokenizer)
    return workload.timed_ppo_steps(trainer, batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", required=True, choices=["rollout", "ppo-step"])
    parser.add_argument("--inputs", required=True, help="JSON file written by run.py")
    parser.add_argument("--max-turns", type=int, nargs="+", default=[4])
    parser.add_argument("--threads", type=int, default=workload.NUM_THREADS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    inputs = workload.read_json(args.inputs)
    if args.workload == "rollout":
        result = run_rollout(inputs, args.max_turns)
    else:
        result = run_ppo_step(inputs)
    import transformers
    import trl

    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}
    workload.emit(result)


if __name__ == "__main__":
    main()
