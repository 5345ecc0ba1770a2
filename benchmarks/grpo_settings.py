"""The `grpo-vs-trl` workload's settings (`grpo_side.py` runs the sides): the defaults, `settings_mapping` (both
sides' arguments built from one `settings` dict), the report's settings rows and the LoRA setup both sides share.

The settings, the same on both sides:

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
"""

from __future__ import annotations

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
