"""The textenv side of the benchmark: `textenv.TextEnvironment` and `textenv.PPOTrainer.step` on the
main venv (torch 2.13, transformers 5). Prints one JSON line. Also makes the fixed PPO batch of the
`ppo-step` workload (`--workload make-ppo-batch`) and the seeded value-head init that both sides load in
both PPO workloads (`--workload make-value-head`).

`--bf16` runs the workload in bf16 mixed precision (`TextEnvironment(..., mixed_precision="bf16")`,
`PPOConfig(accelerator_kwargs={"mixed_precision": "bf16"})`); the default, as on the legacy side, is fp32.
`--vllm-url URL` runs the rollout on a vLLM server (`TextEnvironment(..., engine=VLLMEngine)`, see
`vllm_bench.py`) instead of the in-process engine; `--vllm-pid` (the server's process id, given by run.py)
adds the server's CPU time to the run's.
"""

from __future__ import annotations

import argparse
import contextlib
import warnings

import torch

import vllm_bench
import workload

warnings.filterwarnings("ignore")


def load_model(model_path: str):
    from transformers import AutoModelForCausalLM

    from textenv.models import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    return model, tokenizer


def warm_up(model, tokenizer) -> None:
    ids = tokenizer("What is 1+1?", return_tensors="pt").input_ids
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, pad_token_id=tokenizer.eos_token_id)


def make_environment(model, tokenizer, inputs: dict, max_turns: int, bf16: bool = False, engine=None):
    from textenv import TextEnvironment

    # The keywords are passed only when asked for, so that an fp32 in-process run works with any TextEnvironment.
    options = {"mixed_precision": "bf16"} if bf16 else {}
    if engine is not None:
        options["engine"] = engine
    return TextEnvironment(
        model,
        tokenizer,
        {workload.TOOL_NAME: workload.simple_calculator},
        workload.exact_match_reward,
        inputs["prompt"],
        max_turns=max_turns,
        generation_kwargs=workload.greedy_generation_kwargs(inputs["max_new_tokens"], tokenizer.eos_token_id),
        **options,
    )


def run_rollout(inputs: dict, max_turns_list: list[int], bf16: bool = False, vllm_url: str | None = None, vllm_pid: int | None = None) -> dict:
    """Time one `env.run` per max_turns, each with a fresh environment (and a fresh cache: a new in-process
    engine, or the vLLM server's prefix cache dropped), the episodes at their own pace, as users run them."""
    model, tokenizer = load_model(inputs["model_path"])
    with vllm_bench.prepared_engine(vllm_url, model, tokenizer) if vllm_url else contextlib.nullcontext() as engine:
        if engine is None:
            warm_up(model, tokenizer)
        runs = []
        for max_turns in max_turns_list:
            env = make_environment(model, tokenizer, inputs, max_turns, bf16=bf16, engine=engine)
            if engine is None:
                runs.append(workload.timed_run(env, inputs, time_turns=False))
            else:
                runs.append(vllm_bench.timed_run_on_server(env, engine, inputs, vllm_pid))
        result = {"runs": runs, "peak_rss_mb": workload.peak_rss_mb(), "decoding_path": str(env.decoding_path)}
        return result if engine is None else {**result, **vllm_bench.engine_record(engine)}


def make_ppo_batch(inputs: dict) -> dict:
    """Roll out the `ppo-step` batch once with textenv (greedy, max_turns 4, fp32) and save it, so both
    sides train on the same episodes."""
    model, tokenizer = load_model(inputs["model_path"])
    env = make_environment(model, tokenizer, inputs, max_turns=4)
    queries, responses, masks, rewards, _ = env.run(inputs["queries"], answers=inputs["answers"])
    batch = {
        "queries": [q.tolist() for q in queries],
        "responses": [r.tolist() for r in responses],
        "masks": [m.tolist() for m in masks],
        # Exact-match rewards are mostly 0 for a 135M model; a seeded spread keeps the advantages non-trivial.
        "scores": [float(reward) + 0.25 * ((index * 7) % 5 - 2) for index, reward in enumerate(rewards)],
    }
    with open(inputs["batch_path"], "w") as file:
        import json

        json.dump(batch, file)
    return {"episodes": len(batch["queries"]), "response_lengths": [len(r) for r in batch["responses"]]}


def make_value_head(inputs: dict) -> dict:
    """Save the seeded value-head init (`torch.manual_seed(0)`, then `Linear(hidden_size, 1)`) that both
    sides load in both PPO workloads, so they train from the same weights."""
    hidden_size = workload.read_json(f"{inputs['model_path']}/config.json")["hidden_size"]
    torch.manual_seed(0)
    value_head = torch.nn.Linear(hidden_size, 1)
    torch.save({"summary.weight": value_head.weight.data, "summary.bias": value_head.bias.data}, inputs["value_head_path"])
    return {"hidden_size": hidden_size}


def run_ppo_step(inputs: dict, bf16: bool = False) -> dict:
    from textenv import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
    from textenv.models import load_tokenizer

    batch = workload.read_json(inputs["batch_path"])
    tokenizer = load_tokenizer(inputs["model_path"])
    model = AutoModelForCausalLMWithValueHead.from_pretrained(inputs["model_path"], summary_dropout_prob=0.0)
    model.v_head.load_state_dict(torch.load(inputs["value_head_path"]))
    precision = {"accelerator_kwargs": {"mixed_precision": "bf16"}} if bf16 else {}
    config = PPOConfig(batch_size=len(batch["queries"]), mini_batch_size=inputs["mini_batch_size"], seed=0, **precision)
    trainer = PPOTrainer(config, model, ref_model=None, tokenizer=tokenizer)
    return workload.timed_ppo_steps(trainer, batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", required=True, choices=["rollout", "ppo-step", "make-ppo-batch", "make-value-head"])
    parser.add_argument("--inputs", required=True, help="JSON file written by run.py")
    parser.add_argument("--max-turns", type=int, nargs="+", default=[4])
    parser.add_argument("--threads", type=int, default=workload.NUM_THREADS)
    parser.add_argument("--bf16", action="store_true", help="bf16 mixed precision (rollout and ppo-step)")
    parser.add_argument("--vllm-url", default=None, help="rollout: decode on the vLLM server at this URL")
    parser.add_argument("--vllm-pid", type=int, default=None, help="the --vllm-url server's process id (its CPU time is counted)")
    args = parser.parse_args()
    if args.vllm_url and (args.bf16 or args.workload != "rollout"):
        parser.error("--vllm-url runs the rollout workload in the server's own dtype (no --bf16)")
    torch.set_num_threads(args.threads)
    inputs = workload.read_json(args.inputs)
    if args.workload == "rollout":
        result = run_rollout(inputs, args.max_turns, bf16=args.bf16, vllm_url=args.vllm_url, vllm_pid=args.vllm_pid)
    elif args.workload == "ppo-step":
        result = run_ppo_step(inputs, bf16=args.bf16)
    elif args.workload == "make-value-head":
        result = make_value_head(inputs)
    else:
        result = make_ppo_batch(inputs)
    result["bf16"] = args.bf16
    import transformers

    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    workload.emit(result)


if __name__ == "__main__":
    main()
