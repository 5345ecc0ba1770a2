"""The `grpo-vs-trl` workload, one side per process: textenv's GRPO or TRL 1.16's `GRPOTrainer`, training the bundled
SmolLM2-135M-Instruct on the same calculator tool task (`grpo_task.CalculatorEnv`, one TRL `environment_factory`
class used unchanged by both), on CPU.

    python benchmarks/grpo_side.py --side textenv|trl --inputs grpo-vs-trl.json [--threads 2]

`run.py --workloads grpo-vs-trl` writes the inputs (the model folder, the settings, the training rows and the
held-out rows) and runs both sides in fresh processes, alternating which goes first.

- **textenv**: `GymScheduler(model, tokenizer, environment_factory=CalculatorEnv, ...)` plays the episodes,
  `GymSource` collects whole groups, `textenv.grpo.GRPOTrainer` optimises, `textenv.training.train` runs the steps.
- **TRL**: `trl.GRPOTrainer(model=model, args=trl.GRPOConfig(...), train_dataset=Dataset.from_list(rows),
  environment_factory=CalculatorEnv, processing_class=tokenizer).train()`. TRL refuses the bundled model's own chat
  template (it renders no tool calls: `supports_tool_calling` is False) and cannot parse replies of a template it
  does not know (`add_response_schema` raises): its tokenizer gets textenv's tool-aware ChatML template
  (`CHATML_TOOLS_TEMPLATE`, the one `GymScheduler` itself picks for this model) and TRL's own Hermes/Qwen3 response
  parser (`trl.chat_template_utils.qwen3_template`, for the `<tool_call>{json}</tool_call>` the template writes).
  The side checks and records both refusals on every run ("what TRL needed" in the report).

Settings, the same on both sides: `grpo_settings.py` (`settings_mapping` builds both sides' arguments from one
`settings` dict; its docstring has the table).

A third side, `textenv-padded`, is textenv with `GRPOConfig(share_prompt_prefix=False)`: every row's whole prompt
padded, as before prefix sharing (the code this comparison measures the packed step against).

Measured: wall and CPU time of every training step (the time between the ends of consecutive steps, the first from
the start of training: textenv's call of `train(...)`, TRL's `on_train_begin` callback inside `trainer.train()`; each
side's setup, model loading and the evaluations excluded), the rollout part of each step, the model tokens generated and
model turns, the mean reward of every step, the process's peak RSS before and after training, and held-out accuracy before and after training, measured identically for both
sides: the trained model (TRL's too) plays the fixed held-out rows with textenv's `GymScheduler` and the same env,
greedy (and with `sampled_eval`, sampled at temperature 1); an episode whose reward is >= 1 is solved
(`textenv.gym.evaluate`). Prints one `BENCH_RESULT {json}` line.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
import warnings

import workload
from grpo_settings import (  # noqa: F401 - mapping_rows, trained_weights: re-exported (grpo_bench.py)
    DEFAULTS,
    SIDE_NAMES,
    lora_settings,
    mapping_rows,
    settings_mapping,
    trained_weights,
    with_lora,
)

warnings.filterwarnings("ignore")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is "experimental" in TRL 1.16

TRL_PATH = "transformers generate (TRL GRPOTrainer: a left-padded batch per turn, tools between turns)"


# ------------------------------------------------------------------------------ shared parts
def load(model_path: str):
    import torch

    from textenv.models import load_model

    model, tokenizer = load_model(model_path, dtype=torch.float32)
    return model.eval(), tokenizer


def held_out(model, model_path: str, rows: list[dict], settings: dict, sample: bool) -> dict:
    """The model on the held-out rows, the same way for both sides: textenv's `GymScheduler` with the task's env,
    a fresh tokenizer, greedy or sampled at temperature 1; solved: reward >= 1 (`textenv.gym.evaluate`)."""
    from grpo_task import CalculatorEnv
    from textenv.gym import GymScheduler, evaluate
    from textenv.models import load_tokenizer

    s = {**DEFAULTS, **settings}
    scheduler = GymScheduler(model, load_tokenizer(model_path), environment_factory=CalculatorEnv, max_turns=s["max_turns"],
                             generation_kwargs={"max_new_tokens": s["max_new_tokens"]}, loss_scale="default",
                             batch_size=len(rows), max_concurrency=len(rows))
    was_training = model.training
    evaluation = evaluate(scheduler, rows, sample=sample)
    model.train(was_training)
    return {"accuracy": evaluation.accuracy, "rewards": evaluation.rewards, "seconds": evaluation.seconds,
            "decoding_path": str(scheduler.decoding_path)}


def evaluations(model, model_path: str, rows: list[dict], settings: dict) -> dict:
    modes = {"greedy": False, **({"sampled": True} if settings.get("sampled_eval") else {})}
    return {mode: held_out(model, model_path, rows, settings, sample) for mode, sample in modes.items()}


def step_record(started: float, cpu_started: float, previous: dict | None) -> dict:
    """Wall and CPU seconds since the previous step's end (the first: since training started)."""
    now, cpu_now = time.perf_counter(), workload.cpu_seconds()
    wall_from, cpu_from = (previous["end"], previous["cpu_end"]) if previous else (started, cpu_started)
    return {"seconds": now - wall_from, "seconds_cpu": cpu_now - cpu_from, "end": now, "cpu_end": cpu_now}


def finish(steps: list[dict], before: dict, after: dict, peak_rss_mb: float, **extra) -> dict:
    """The side's `BENCH_RESULT`: per-step figures, totals, evaluations, versions."""
    import torch
    import transformers

    seconds = [step["seconds"] for step in steps]
    for step in steps:
        step.pop("end", None)
        step.pop("cpu_end", None)
    return {
        "steps": steps,
        "step_seconds_median": statistics.median(seconds) if seconds else float("nan"),
        "seconds": sum(seconds),
        "seconds_cpu": sum(step["seconds_cpu"] for step in steps),
        "episodes": sum(step["episodes"] for step in steps),
        "generated_tokens": sum(step["generated_tokens"] for step in steps),
        "model_turns": sum(step.get("model_turns", 0) for step in steps),
        "peak_rss_mb": peak_rss_mb,
        "before": before,
        "after": after,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, **extra.pop("versions", {})},
        **extra,
    }


# ------------------------------------------------------------------------------ textenv
def run_textenv(inputs: dict, share_prompt_prefix: bool = True) -> dict:
    """textenv's side: GymScheduler + GymSource + textenv.grpo.GRPOTrainer + textenv.training.train (with
    ``share_prompt_prefix=False``: the `textenv-padded` side)."""
    from grpo_task import CalculatorEnv
    from textenv.grpo import GRPOConfig, GRPOTrainer
    from textenv.gym import GymScheduler, GymSource
    from textenv.training import train

    settings, model_path = inputs["settings"], inputs["model_path"]
    model, tokenizer = load(model_path)
    before = evaluations(model, model_path, inputs["eval_rows"], settings)
    mapping = settings_mapping(settings)["textenv"]
    model = with_lora(model, settings)
    scheduler = GymScheduler(model, tokenizer, environment_factory=CalculatorEnv, **mapping["GymScheduler"])
    config = GRPOConfig(**mapping["GRPOConfig"], share_prompt_prefix=share_prompt_prefix)
    trainer = GRPOTrainer(config, model=model, tokenizer=tokenizer)
    source = GymSource(scheduler, inputs["train_rows"], batch_size=trainer.config.batch_size)
    peak_before = workload.peak_rss_mb()
    steps: list[dict] = []
    started, cpu_started = time.perf_counter(), workload.cpu_seconds()

    def on_step(log) -> None:
        record = step_record(started, cpu_started, steps[-1] if steps else None)
        record.update(rollout_seconds=log.episode_seconds, episodes=len(log.batch.queries), reward_mean=log.reward_mean,
                      generated_tokens=int(sum(int(mask.sum()) for mask in log.batch.masks)),
                      model_turns=sum(episode.num_turns for episode in log.batch.episodes))
        if not steps:
            record["first_prompt_ids"] = log.batch.queries[0].tolist()
        steps.append(record)

    train(trainer, source, settings.get("steps", DEFAULTS["steps"]), on_step=on_step, progress=False)
    peak = workload.peak_rss_mb()
    after = evaluations(model, model_path, inputs["eval_rows"], settings)
    first_prompt = steps[0].pop("first_prompt_ids") if steps else []
    return finish(steps, before, after, peak, decoding_path=str(scheduler.decoding_path), first_prompt_ids=first_prompt,
                  peak_rss_before_training_mb=peak_before, packed=trainer.packed_config is not None)


# ------------------------------------------------------------------------------ TRL
def trl_tokenizer(model_path: str):
    """The tokenizer TRL is given, and what it took: TRL refuses the bundled model's chat template (no tool calls
    rendered) and cannot parse replies of a template it does not know; each refusal is checked and recorded."""
    from trl.chat_template_utils import add_response_schema, qwen3_template, supports_tool_calling

    from textenv.chat.templates import CHATML_TOOLS_TEMPLATE
    from textenv.models import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    needed = []
    if not supports_tool_calling(tokenizer):
        needed.append("the model's own chat template renders no tool calls (trl.chat_template_utils.supports_tool_calling "
                      "is False: GRPOTrainer raises ValueError 'The provided chat template does not support tool calling'): "
                      "given textenv's CHATML_TOOLS_TEMPLATE as tokenizer.chat_template")
        tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        try:
            add_response_schema(copy.deepcopy(tokenizer))
        except ValueError as error:
            needed.append(f"TRL knows no response parser for that template (add_response_schema: {str(error).split('.')[0]}): "
                          "given tokenizer.response_template = trl.chat_template_utils.qwen3_template (Hermes "
                          "<tool_call>{json}</tool_call>, what the template writes)")
            tokenizer.response_template = qwen3_template
    return tokenizer, needed


def run_trl(inputs: dict) -> dict:
    """TRL's side: trl.GRPOTrainer(environment_factory=CalculatorEnv).train(), timed by a callback."""
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    from grpo_task import CalculatorEnv

    settings, model_path = inputs["settings"], inputs["model_path"]
    model, _ = load(model_path)
    before = evaluations(model, model_path, inputs["eval_rows"], settings)
    tokenizer, needed = trl_tokenizer(model_path)
    steps: list[dict] = []
    current = {"rollout_seconds": 0.0, "generated_tokens": 0, "episodes": 0, "model_turns": 0}
    first_prompt: list[int] = []
    clock: dict = {}

    class StepTimes(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.update(started=time.perf_counter(), cpu_started=workload.cpu_seconds())

        def on_step_end(self, args, state, control, **kwargs):
            record = step_record(clock["started"], clock["cpu_started"], steps[-1] if steps else None)
            record.update(current)
            current.update(rollout_seconds=0.0, generated_tokens=0, episodes=0, model_turns=0)
            steps.append(record)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if steps and logs and "reward" in logs:
                steps[-1]["reward_mean"] = float(logs["reward"])

    with tempfile.TemporaryDirectory(prefix="grpo-vs-trl-") as output_dir:
        args = trl.GRPOConfig(output_dir=output_dir, **settings_mapping(settings)["trl"]["GRPOConfig"])
        trainer = trl.GRPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(inputs["train_rows"]),
                                  processing_class=tokenizer, environment_factory=CalculatorEnv, callbacks=[StepTimes()],
                                  peft_config=lora_settings(model, settings))
        generate_turn, generate_and_score = trainer._generate_single_turn, trainer._generate_and_score_completions

        def counted_turn(prompt_ids, *args, **kwargs):  # every model turn: count the tokens it generated
            completion_ids, logprobs = generate_turn(prompt_ids, *args, **kwargs)
            if not first_prompt:
                first_prompt.extend(prompt_ids[0])
            current["generated_tokens"] += sum(len(ids) for ids in completion_ids)
            current["model_turns"] += len(completion_ids)
            return completion_ids, logprobs

        def timed_rollout(*args, **kwargs):  # a generation batch: episodes played, tools called, rewards
            rollout_started = time.perf_counter()
            output = generate_and_score(*args, **kwargs)
            current["rollout_seconds"] += time.perf_counter() - rollout_started
            current["episodes"] += len(output["completion_ids"])
            return output

        trainer._generate_single_turn, trainer._generate_and_score_completions = counted_turn, timed_rollout
        peak_before = workload.peak_rss_mb()
        trainer.train()
    peak = workload.peak_rss_mb()
    trained = trainer.accelerator.unwrap_model(trainer.model)
    after = evaluations(trained, model_path, inputs["eval_rows"], settings)
    return finish(steps, before, after, peak, decoding_path=TRL_PATH, first_prompt_ids=first_prompt, trl_needed=needed,
                  peak_rss_before_training_mb=peak_before, versions={"trl": trl.__version__})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", required=True, choices=SIDE_NAMES)
    parser.add_argument("--inputs", required=True, help="the workload's inputs, written by run.py")
    parser.add_argument("--threads", type=int, default=workload.NUM_THREADS)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    inputs = workload.read_json(args.inputs)
    runs = {"trl": run_trl, "textenv": run_textenv, "textenv-padded": lambda inputs: run_textenv(inputs, share_prompt_prefix=False)}
    workload.emit({"side": args.side, **runs[args.side](inputs)})


if __name__ == "__main__":
    main()
