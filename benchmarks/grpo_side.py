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

Settings, the same on both sides (`settings_mapping` builds both sides' arguments from one `settings` dict):

    setting                   textenv                                           TRL 1.16
    episodes per step         GRPOConfig(batch_size=16)                         per_device_train_batch_size=4 x
                                                                                steps_per_generation=4 (16 per generation)
    one optimizer step/batch  mini_batch_size=4, gradient_accumulation_steps    gradient_accumulation_steps=4
                              default (all 4 mini-batches of a batch)           (= steps_per_generation)
    group size                num_generations=4                                 num_generations=4
    learning rate, schedule   learning_rate=1e-5, constant (no scheduler)       learning_rate=1e-5, lr_scheduler_type="constant",
                                                                                warmup_steps=0
    optimizer                 Adam (fused), betas 0.9/0.999, eps 1e-8           adamw_torch_fused, weight_decay=0.0 (same update)
    loss                      beta=0, loss_type="dapo", epsilon=0.2,            the same, scale_rewards="group",
                              scale_rewards="group", num_iterations=1           num_iterations=1
    gradient clipping         max_grad_norm=1.0                                 max_grad_norm=1.0
    sampling                  do_sample, temperature 1.0, top_k 0, top_p 1.0    temperature=1.0, top_k=0, top_p=1.0
    tokens per model turn     generation max_new_tokens=64                      generation_kwargs={"max_new_tokens": 64}
    turns                     max_turns=3                                       max_tool_calling_iterations=2
    whole completion          (no cap beyond max_turns x 64 model tokens)       max_completion_length=192 (3 x 64; TRL
                                                                                also counts the tool results' tokens)
    trained tokens            every model reply (loss_scale="default"),         every model token (tool_mask 0 on tool
                              tool results masked                               results), mask_truncated_completions=False
    precision, device         fp32 on CPU                                       use_cpu=True, bf16=False, fp16=False
    rows                      GymSource cycles the training rows in order       shuffle_dataset=False (the same order)
    other                     no gradient checkpointing, seed=0                 activation_checkpointing=False (TRL's
                                                                                default is on), seed=0,
                                                                                report_to="none", save_strategy="no"
    LoRA (lora_layers set)    the policy wrapped by peft.get_peft_model with    peft_config= the same LoraConfig
                              textenv.training.policy.lora_config(rank, layers) (r, alpha 2r, dropout 0, attention and
                                                                                MLP projections of the top layers)

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

warnings.filterwarnings("ignore")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is "experimental" in TRL 1.16

DEFAULTS = {
    "steps": 8,
    "batch_size": 16,
    "num_generations": 4,
    "mini_batch_size": 4,  # rows per forward/backward (TRL's per_device_train_batch_size); textenv's default is 8
    "learning_rate": 1e-5,
    "beta": 0.0,
    "loss_type": "dapo",
    "epsilon": 0.2,
    "scale_rewards": "group",
    "max_grad_norm": 1.0,
    "temperature": 1.0,
    "max_new_tokens": 64,
    "max_turns": 3,
    "seed": 0,
    "sampled_eval": False,
    "shots": 2,  # solved examples in every prompt (grpo_task.EXAMPLES): 2 gives a 648-token prompt
    "lora_layers": None,  # None: full fine-tuning; N: LoRA (rank lora_rank) on the top N layers, 0 on all of them
    "lora_rank": 16,
    "sides": ["trl", "textenv"],  # also "textenv-padded": textenv with share_prompt_prefix=False (every row padded, whole)
}
SIDE_NAMES = ("trl", "textenv", "textenv-padded")
TRL_PATH = "transformers generate (TRL GRPOTrainer: a left-padded batch per turn, tools between turns)"


# ------------------------------------------------------------------------------ settings
def settings_mapping(settings: dict) -> dict[str, dict]:
    """Both sides' arguments from one `settings` dict: ``{"textenv": {"GRPOConfig": ..., "GymScheduler": ...},
    "trl": {"GRPOConfig": ...}}`` (TRL's without `output_dir`)."""
    s = {**DEFAULTS, **settings}
    batch, mini = s["batch_size"], s["mini_batch_size"]
    unknown = set(s["sides"]) - set(SIDE_NAMES)
    if unknown or not s["sides"]:
        raise ValueError(f"sides must be some of {SIDE_NAMES}, got {s['sides']}.")
    if batch % mini or batch % s["num_generations"]:
        raise ValueError(f"batch_size {batch} must be a multiple of mini_batch_size {mini} and num_generations {s['num_generations']}.")
    accumulation = batch // mini  # mini-batches per batch: one optimizer step per batch on both sides
    shared = {name: s[name] for name in ("num_generations", "learning_rate", "beta", "loss_type", "epsilon", "scale_rewards",
                                         "max_grad_norm", "temperature", "seed")}
    textenv_config = {**shared, "batch_size": batch, "mini_batch_size": mini, "num_iterations": 1, "steps": s["steps"] * batch,
                      "gradient_checkpointing": False, "mask_truncated_completions": False}
    sampling = {"do_sample": True, "temperature": s["temperature"], "top_k": 0, "top_p": 1.0, "max_new_tokens": s["max_new_tokens"]}
    scheduler = {"max_turns": s["max_turns"], "generation_kwargs": sampling, "loss_scale": "default", "batch_size": batch,
                 "max_concurrency": batch}
    trl_config = {
        **shared,
        "per_device_train_batch_size": mini, "gradient_accumulation_steps": accumulation, "steps_per_generation": accumulation,
        "num_iterations": 1, "max_steps": s["steps"], "lr_scheduler_type": "constant", "warmup_steps": 0, "weight_decay": 0.0,
        "top_k": 0, "top_p": 1.0, "generation_kwargs": {"max_new_tokens": s["max_new_tokens"]},
        "max_completion_length": s["max_turns"] * s["max_new_tokens"], "max_tool_calling_iterations": s["max_turns"] - 1,
        "mask_truncated_completions": False, "shuffle_dataset": False, _checkpointing_argument(): False,
        "use_cpu": True, "bf16": False, "fp16": False, "report_to": "none", "save_strategy": "no", "logging_steps": 1,
        "disable_tqdm": True, "dataloader_num_workers": 0, "log_completions": False,
    }
    return {"textenv": {"GRPOConfig": textenv_config, "GymScheduler": scheduler}, "trl": {"GRPOConfig": trl_config}}


def _checkpointing_argument() -> str:
    """TRL's GRPOConfig turns gradient checkpointing on by default; transformers 5.24 renamed the argument
    (`gradient_checkpointing` is a deprecated alias of `activation_checkpointing`)."""
    import dataclasses

    from transformers import TrainingArguments

    names = {field.name for field in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def mapping_rows(settings: dict) -> list[list[str]]:
    """`[setting, textenv, TRL]` rows of what each side is given, read from `settings_mapping` (for the report)."""
    m = settings_mapping(settings)
    config, scheduler, trl = m["textenv"]["GRPOConfig"], m["textenv"]["GymScheduler"], m["trl"]["GRPOConfig"]
    sampling = scheduler["generation_kwargs"]

    def args(source: dict, *names: str) -> str:
        return ", ".join(f"{name}={source[name]!r}" for name in names)

    return [
        ["episodes per step, one optimizer step", args(config, "batch_size", "mini_batch_size") + ", gradient_accumulation_steps=None (all)",
         args(trl, "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation")],
        ["group", args(config, "num_generations"), args(trl, "num_generations")],
        ["learning rate", args(config, "learning_rate") + ", constant", args(trl, "learning_rate", "lr_scheduler_type", "warmup_steps")],
        ["loss", args(config, "beta", "loss_type", "epsilon", "scale_rewards", "num_iterations"),
         args(trl, "beta", "loss_type", "epsilon", "scale_rewards", "num_iterations")],
        ["clipping, seed", args(config, "max_grad_norm", "seed"), args(trl, "max_grad_norm", "seed")],
        ["sampling", args(sampling, "temperature", "top_k", "top_p"), args(trl, "temperature", "top_k", "top_p")],
        ["tokens per turn", f"max_new_tokens={sampling['max_new_tokens']}", f"generation_kwargs={trl['generation_kwargs']}"],
        ["turns", args(scheduler, "max_turns"), args(trl, "max_tool_calling_iterations") + ", " + args(trl, "max_completion_length")],
        ["precision", "fp32, CPU", args(trl, "use_cpu", "bf16", "fp16")],
        ["weights trained", trained_weights(settings), trained_weights(settings)],
        ["prompt", f"system + tools + {settings.get('shots', DEFAULTS['shots'])} solved examples + question", "the same"],
    ]


def trained_weights(settings: dict) -> str:
    """What the sides train, in words: all weights, or LoRA adapters on which layers."""
    s = {**DEFAULTS, **settings}
    layers, rank = s["lora_layers"], s["lora_rank"]
    if layers is None:
        return "all (full fine-tuning)"
    return f"LoRA r={rank} on the top {layers} layers" if layers else f"LoRA r={rank} on every layer"


def with_lora(model, settings: dict):
    """``model`` as the side trains it: itself, or wrapped with LoRA adapters (`settings["lora_layers"]`)."""
    config = lora_settings(model, settings)
    if config is None:
        return model
    from peft import get_peft_model

    return get_peft_model(model, config)


def lora_settings(model, settings: dict):
    """The `peft.LoraConfig` both sides use, or ``None`` for full fine-tuning."""
    s = {**DEFAULTS, **settings}
    if s["lora_layers"] is None:
        return None
    from textenv.training.policy import lora_config

    return lora_config(s["lora_rank"], s["lora_layers"], model.config.num_hidden_layers)


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
