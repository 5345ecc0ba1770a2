"""Time and peak memory (RSS) of one `PPOTrainer.step` on the bundled model (CPU by default).

    python benchmarks/ppo_step.py                       # batch 8, bundled SmolLM2-135M, CPU
    python benchmarks/ppo_step.py --steps 3 --json out.json

The batch imitates TextEnvironment output on the calculator task: the 2-shot calculator prompt plus a
question as query, and a response made of a model turn, a masked tool response and a final model turn.
Peak RSS is sampled every 5 ms by a thread during the step (and also reported as the process-wide
``ru_maxrss`` high-water mark, which includes model loading).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import threading
import time
import warnings

import psutil
import torch

from textenv.hardware import describe_cpu
from textenv.models import load_bundled_model
from textenv.ppo import PPOConfig, PPOTrainer
from textenv.tasks import calculator as task


class PeakRSS:
    """Context manager sampling this process's resident set size; ``peak`` in bytes."""

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.process = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval)

    def __enter__(self) -> "PeakRSS":
        self.peak = self.process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def make_episodes(tokenizer, batch_size: int, seed: int):
    """Calculator-style (query, response, mask, score) lists like TextEnvironment returns."""
    rng = random.Random(seed)
    queries, responses, masks, scores = [], [], [], []
    for _ in range(batch_size):
        question, answer = task.random_task(rng)
        expression = question.split("What is ")[1].split("?")[0]
        result = str(int(answer))
        query = tokenizer(task.PROMPT + question, return_tensors="pt").input_ids[0]
        call = tokenizer(f"<request><Calculator>{expression}<call>", add_special_tokens=False).input_ids
        tool = tokenizer(f"{result}<response>", add_special_tokens=False).input_ids
        final = tokenizer(f"\nResult={result}<submit>", add_special_tokens=False).input_ids
        queries.append(query)
        responses.append(torch.tensor(call + tool + final))
        masks.append(torch.tensor([1] * len(call) + [0] * len(tool) + [1] * len(final)))
        scores.append(torch.tensor(float(rng.random() < 0.5)))
    return queries, responses, scores, masks


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--mini-batch-size", type=int, default=8)
    parser.add_argument("--ppo-epochs", type=int, default=4)
    parser.add_argument("--kl-penalty", default="kl", choices=["kl", "abs", "mse", "full"])
    parser.add_argument("--steps", type=int, default=1, help="steps to time (each reported)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads, 0 = torch default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-share-prefix", action="store_true", help="run every row in full (PPOConfig.share_prompt_prefix=False)")
    parser.add_argument("--step-in-backward", action="store_true", help="opt in to PPOConfig.step_in_backward (no .grad left)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = load_bundled_model(value_head=True)
    config = PPOConfig(batch_size=args.batch_size, mini_batch_size=args.mini_batch_size, ppo_epochs=args.ppo_epochs,
                       kl_penalty=args.kl_penalty, accelerator_kwargs={"cpu": args.device == "cpu"},
                       share_prompt_prefix=not args.no_share_prefix, step_in_backward=args.step_in_backward)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")
        trainer = PPOTrainer(config, model, tokenizer=tokenizer)
    queries, responses, scores, masks = make_episodes(tokenizer, args.batch_size, seed=0)
    rss_before = psutil.Process().memory_info().rss
    results = {
        "batch_size": args.batch_size, "mini_batch_size": args.mini_batch_size, "ppo_epochs": args.ppo_epochs,
        "query_tokens_mean": sum(len(q) for q in queries) / len(queries),
        "response_tokens_mean": sum(len(r) for r in responses) / len(responses),
        "torch_threads": torch.get_num_threads(), "device": str(trainer.current_device),
        "share_prompt_prefix": config.share_prompt_prefix, "step_in_backward": config.step_in_backward,
        "rss_before_step_mb": rss_before / 2**20, "steps": [],
    }
    for _ in range(args.steps):
        with PeakRSS() as memory:
            started = time.perf_counter()
            stats = trainer.step(queries, responses, scores, masks)
            seconds = time.perf_counter() - started
        results["steps"].append({
            "seconds": seconds, "peak_rss_mb": memory.peak / 2**20,
            "forward_pass_s": stats["time/ppo/forward_pass"], "optimize_step_s": stats["time/ppo/optimize_step"],
            "loss_total": stats["ppo/loss/total"],
        })
    results["ru_maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results["cpu"] = describe_cpu()
    print(f"PPO step: batch {args.batch_size}, mini-batch {args.mini_batch_size}, {args.ppo_epochs} epochs, "
          f"query ~{results['query_tokens_mean']:.0f} tokens, response ~{results['response_tokens_mean']:.0f} tokens, "
          f"{results['device']}, {results['torch_threads']} threads, shared prompt prefix: {config.share_prompt_prefix}; "
          f"CPU: {results['cpu']}")
    for index, step in enumerate(results["steps"]):
        print(f"step {index + 1}: {step['seconds']:.2f} s (forward {step['forward_pass_s']:.2f} s, optimise "
              f"{step['optimize_step_s']:.2f} s), peak RSS {step['peak_rss_mb']:.0f} MiB "
              f"(before the step {results['rss_before_step_mb']:.0f} MiB)")
    print(f"process high-water RSS (includes loading): {results['ru_maxrss_mb']:.0f} MiB")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
    return results


if __name__ == "__main__":
    main()
