"""The calculator training loop, shared by `textenv demo` and `examples/calculator.py`.

One PPO iteration is `rollout -> PPOTrainer.step -> log`:

1. `TextEnvironment.run` plays one episode per task with the policy (sampling at temperature 1, like the
   legacy example) and scores it with the exact-match reward;
2. `PPOTrainer.step` takes the query tokens, the response tokens (model and tool tokens interleaved), the
   rewards and the masks (1 = model token);
3. the step's statistics go to the trainer's trackers (`log_stats`) and into a `StepLog`.

`evaluate` measures a policy on a fixed task set, sampled or greedy.
"""

from __future__ import annotations

import random
import resource
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from textenv.environment import TextEnvironment, TextHistory
from textenv.tasks import calculator as task
from textenv.tools import Calculator

# Sampling exactly as the legacy example: temperature 1, no top-k / top-p filtering.
SAMPLING_KWARGS = {"do_sample": True, "top_k": 0, "top_p": 1.0, "temperature": 1.0}
GREEDY_KWARGS = {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TINY_MODEL = "tiny"


@dataclass
class Settings:
    """Everything one calculator training run depends on. The defaults are the demo's settings.

    Tuning note (bundled model, LoRA r=16 on the top 8 layers, 16 episodes per step): a learning rate of
    1e-3 with 4 mini-batches per step wrecked the policy in one step (KL 2.5, training reward 0.50 -> 0.06).

    Attributes:
        model: `"bundled"` (SmolLM2-135M-Instruct), `"tiny"` (a random tiny model, for smoke tests) or a
            local folder / hub id of a causal LM.
        device: torch device of the policy (`"cpu"`, `"cuda"`, ...).
        threads: torch CPU threads (`torch.set_num_threads`); 0 leaves torch's default.
        seed: seed of torch, of the training tasks and of the PPO trainer.
        steps: PPO steps.
        batch_size: episodes per PPO step.
        mini_batch_size: episodes per PPO mini-batch (forward + backward).
        ppo_epochs: optimisation passes over each batch.
        learning_rate: Adam learning rate.
        init_kl_coef: initial weight of the KL penalty to the reference policy.
        adap_kl_ctrl: adapt the KL weight towards `kl_target`.
        kl_target: target KL of the adaptive controller.
        lora: train LoRA adapters (peft) instead of all weights.
        lora_rank: LoRA rank `r` (`lora_alpha = 2 * r`).
        lora_layers: put adapters on the top `lora_layers` decoder layers only (0 = all layers). Gradients
            then stop at the lowest adapted layer, which makes the backward pass much cheaper on a CPU.
        value_head_init_std: the value head starts with weights ~ N(0, this) and bias 0, so its first
            values are about 0. With PyTorch's default init the bundled model's values differ by ~1.3
            from one position to the next, more than the 0/1 reward, and the first PPO steps follow that
            noise. 0 keeps the default init.
        max_new_tokens: tokens per model turn.
        max_turns: model turns per episode.
        generation_batch_size: episodes generated together.
        eval_tasks: size of the held-out task set.
        eval_seed: seed of the held-out task set.
    """

    model: str = "bundled"
    device: str = "cpu"
    threads: int = 2
    seed: int = 0
    steps: int = 20
    batch_size: int = 16
    mini_batch_size: int = 4
    ppo_epochs: int = 1
    learning_rate: float = 2e-4
    init_kl_coef: float = 0.02
    adap_kl_ctrl: bool = True
    kl_target: float = 6.0
    lora: bool = True
    lora_rank: int = 16
    lora_layers: int = 8
    value_head_init_std: float = 1e-3
    max_new_tokens: int = 24
    max_turns: int = 3
    generation_batch_size: int = 50
    eval_tasks: int = 100
    eval_seed: int = 1234


@dataclass
class Evaluation:
    """The result of `evaluate`: accuracy, the per-episode rewards and histories, and the wall time."""

    accuracy: float
    rewards: list[float]
    histories: list[TextHistory]
    seconds: float


@dataclass
class StepLog:
    """What one PPO step did: mean training reward, KL to the reference, and where the time went."""

    step: int
    reward_mean: float
    kl: float
    kl_coef: float
    rollout_seconds: float
    ppo_seconds: float
    stats: dict = field(default_factory=dict, repr=False)


# --------------------------------------------------------------------------------------------- set-up
def add_training_arguments(parser, defaults: Settings, mini_batch_size: int | None = None) -> None:
    """Add the options every tool-learning example shares (model, device, PPO sizes, LoRA, turns,
    logging) to an `argparse` parser, with `defaults` as their defaults; read them back with
    `settings_from_args`. ``mini_batch_size``: the default of ``--mini-batch-size`` (``None``: the batch
    size)."""
    import argparse

    parser.add_argument("--model", default=defaults.model, help="'bundled' (SmolLM2-135M-Instruct), 'tiny' (random, for smoke tests), or a folder / hub id (default: %(default)s)")
    parser.add_argument("--device", default=defaults.device, help="torch device, e.g. cpu or cuda (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=defaults.threads, help="torch CPU threads, 0 = torch default (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--steps", type=int, default=defaults.steps, help="PPO steps (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size, help="episodes per PPO step (default: %(default)s)")
    mini_batch_help = "(default: %(default)s)" if mini_batch_size is not None else "(default: the batch size)"
    parser.add_argument("--mini-batch-size", type=int, default=mini_batch_size, help=f"episodes per mini-batch {mini_batch_help}")
    parser.add_argument("--ppo-epochs", type=int, default=defaults.ppo_epochs, help="(default: %(default)s, as in the legacy example)")
    parser.add_argument("--lr", type=float, default=defaults.learning_rate, help="learning rate (default: %(default)s)")
    parser.add_argument("--init-kl-coef", type=float, default=defaults.init_kl_coef, help="(default: %(default)s)")
    parser.add_argument("--lora", action=argparse.BooleanOptionalAction, default=defaults.lora, help="train LoRA adapters instead of all weights (default: %(default)s)")
    parser.add_argument("--lora-rank", type=int, default=defaults.lora_rank, help="(default: %(default)s)")
    parser.add_argument("--lora-layers", type=int, default=defaults.lora_layers, help="adapt only the top N layers, 0 = all (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens, help="tokens per model turn (default: %(default)s)")
    parser.add_argument("--max-turns", type=int, default=defaults.max_turns, help="model turns per episode: tool call, then answer (default: %(default)s)")
    parser.add_argument("--log-dir", default="runs", help="tensorboard logging_dir (default: %(default)s)")
    parser.add_argument("--save-dir", default=None, help="save the trained model (adapters + value head) here")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")


def settings_from_args(args) -> Settings:
    """The training loop's `Settings` from the options of `add_training_arguments`."""
    return Settings(
        model=args.model,
        device=args.device,
        threads=args.threads,
        seed=args.seed,
        steps=args.steps,
        batch_size=args.batch_size,
        mini_batch_size=args.mini_batch_size or args.batch_size,
        ppo_epochs=args.ppo_epochs,
        learning_rate=args.lr,
        init_kl_coef=args.init_kl_coef,
        lora=args.lora,
        lora_rank=args.lora_rank,
        lora_layers=args.lora_layers,
        max_new_tokens=args.max_new_tokens,
        max_turns=args.max_turns,
        generation_batch_size=args.batch_size,
    )


def seed_everything(seed: int, threads: int = 0) -> None:
    """Seed `random` and torch; with `threads > 0`, also fix the number of torch CPU threads."""
    random.seed(seed)
    torch.manual_seed(seed)
    if threads > 0:
        torch.set_num_threads(threads)


def lora_config(rank: int, layers: int, num_hidden_layers: int):
    """A peft `LoraConfig` on the attention and MLP projections of the top `layers` decoder layers
    (all layers when `layers` is 0)."""
    from peft import LoraConfig

    layers_to_transform = None
    if 0 < layers < num_hidden_layers:
        layers_to_transform = list(range(num_hidden_layers - layers, num_hidden_layers))
    return LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        lora_dropout=0.0,
        target_modules=list(LORA_TARGET_MODULES),
        layers_to_transform=layers_to_transform,
        task_type="CAUSAL_LM",
    )


def load_policy(settings: Settings):
    """The policy to train (an `AutoModelForCausalLMWithValueHead`, with LoRA adapters if
    `settings.lora`) and its tokenizer.

    Returns:
        `(model, tokenizer)`.
    """
    from textenv.models import load_model, load_tokenizer
    from textenv.ppo import AutoModelForCausalLMWithValueHead

    if settings.model == TINY_MODEL:
        from textenv.testing import tiny_causal_lm

        base, tokenizer = tiny_causal_lm(seed=settings.seed), load_tokenizer()
    else:
        base, tokenizer = load_model(settings.model)
    base.to(settings.device)
    peft_config = None
    if settings.lora:
        peft_config = lora_config(settings.lora_rank, settings.lora_layers, base.config.num_hidden_layers)
    head_init = {}
    if settings.value_head_init_std > 0:
        head_init = {"v_head_init_strategy": "normal", "v_head_initializer_range": settings.value_head_init_std}
    model = AutoModelForCausalLMWithValueHead.from_pretrained(base, peft_config=peft_config, **head_init)
    model.v_head.to(settings.device)
    return model.eval(), tokenizer


def build_environment(model, tokenizer, settings: Settings) -> TextEnvironment:
    """The calculator TextEnvironment: the 2-shot prompt, the `Calculator` tool and the exact-match
    reward, sampling at temperature 1."""
    return TextEnvironment(
        model,
        tokenizer,
        {task.TOOL_NAME: Calculator()},
        task.exact_match_reward,
        task.PROMPT,
        max_turns=settings.max_turns,
        generation_kwargs={**SAMPLING_KWARGS, "max_new_tokens": settings.max_new_tokens},
        batch_size=settings.generation_batch_size,
    )


def build_trainer(model, tokenizer, settings: Settings, log_dir: str | None = None, name: str = "calculator"):
    """A `PPOTrainer` for `model` (the reference is the model with its adapters disabled when it uses
    LoRA). With `log_dir`, statistics are logged to tensorboard there, under the run `name`."""
    from textenv.ppo import PPOConfig, PPOTrainer

    config = PPOConfig(
        exp_name=name,
        seed=settings.seed,
        steps=settings.steps * settings.batch_size,
        learning_rate=settings.learning_rate,
        batch_size=settings.batch_size,
        mini_batch_size=settings.mini_batch_size,
        ppo_epochs=settings.ppo_epochs,
        init_kl_coef=settings.init_kl_coef,
        adap_kl_ctrl=settings.adap_kl_ctrl,
        target=settings.kl_target,
        log_with="tensorboard" if log_dir else None,
        project_kwargs={"logging_dir": log_dir} if log_dir else {},
        tracker_project_name=name,
    )
    with warnings.catch_warnings():  # episodes come from TextEnvironment, not from a dataset
        warnings.filterwarnings("ignore", message="No dataset is provided", category=UserWarning)
        return PPOTrainer(config, model, ref_model=None, tokenizer=tokenizer)


# --------------------------------------------------------------------------------------------- tasks
def training_task_batches(batch_size: int, seed: int, exclude: Sequence[str] = ()) -> Iterator[tuple[list[str], list[float]]]:
    """An endless stream of `(queries, answers)` batches of random calculator tasks, never one of
    `exclude` (the held-out queries)."""
    held_out = set(exclude)
    rng = random.Random(seed)
    while True:
        queries, answers = [], []
        while len(queries) < batch_size:
            query, answer = task.random_task(rng)
            if query not in held_out:
                queries.append(query)
                answers.append(answer)
        yield queries, answers


# --------------------------------------------------------------------------------------------- loop
@contextmanager
def generation_mode(env: TextEnvironment, sample: bool):
    """Temporarily make `env` sample at temperature 1 (`sample=True`) or decode greedily."""
    saved = env.generation_kwargs
    mode = SAMPLING_KWARGS if sample else GREEDY_KWARGS
    env.generation_kwargs = {**saved, **mode}
    try:
        yield env
    finally:
        env.generation_kwargs = saved


def evaluate(env: TextEnvironment, queries: Sequence[str], answers: Sequence[float], sample: bool) -> Evaluation:
    """Accuracy of the environment's model on `queries` (exact-match reward), sampled at temperature 1
    or greedy.

    Args:
        env: a calculator `TextEnvironment` (see `build_environment`).
        queries, answers: the tasks, e.g. from `textenv.tasks.calculator.generate_tasks`.
        sample: sample at temperature 1 (the policy as it is trained) instead of greedy decoding.

    Returns:
        An `Evaluation` (accuracy in [0, 1], rewards, histories, seconds).
    """
    env.model.eval()
    started = time.perf_counter()
    with generation_mode(env, sample):
        *_, rewards, histories = env.run(list(queries), answers=list(answers))
    rewards = [float(reward) for reward in rewards]
    return Evaluation(sum(rewards) / len(rewards), rewards, histories, time.perf_counter() - started)


def train_step(ppo_trainer, env: TextEnvironment, queries: list[str], answers: list[float], step: int) -> StepLog:
    """One PPO iteration: play the episodes, optimise on them, log the statistics."""
    env.model.eval()
    started = time.perf_counter()
    query_tokens, responses, masks, rewards, histories = env.run(queries, answers=answers)
    rollout_seconds = time.perf_counter() - started
    scores = [torch.tensor(float(reward)) for reward in rewards]
    stats = ppo_trainer.step(query_tokens, responses, scores, masks)
    ppo_seconds = time.perf_counter() - started - rollout_seconds
    batch = {"query": queries, "response": [_response_text(history) for history in histories]}
    ppo_trainer.log_stats(stats, batch, scores)
    return StepLog(
        step=step,
        reward_mean=sum(float(s) for s in scores) / len(scores),
        kl=float(stats["objective/kl"]),
        kl_coef=float(stats["objective/kl_coef"]),
        rollout_seconds=rollout_seconds,
        ppo_seconds=ppo_seconds,
        stats=stats,
    )


def train(
    ppo_trainer,
    env: TextEnvironment,
    task_batches: Iterator[tuple[list[str], list[float]]],
    steps: int,
    progress: bool = True,
    on_step: Callable[[StepLog], None] | None = None,
    deadline: float | None = None,
) -> list[StepLog]:
    """Run `steps` PPO iterations on batches from `task_batches`, with a tqdm progress bar.

    Args:
        deadline: a `time.perf_counter()` value; no step is started that would, at the mean speed of the
            steps so far, end after it. `None`: always run all `steps`.

    Returns:
        One `StepLog` per step that ran.
    """
    from tqdm.auto import tqdm

    logs = []
    bar = tqdm(range(steps), desc="PPO", unit="step", disable=not progress)
    started = time.perf_counter()
    for step in bar:
        if deadline is not None and logs:
            mean_step_seconds = (time.perf_counter() - started) / len(logs)
            if time.perf_counter() + mean_step_seconds > deadline:
                bar.write(f"time budget reached: stopping after {len(logs)} of {steps} steps")
                break
        queries, answers = next(task_batches)
        log = train_step(ppo_trainer, env, queries, answers, step)
        logs.append(log)
        bar.set_postfix(reward=f"{log.reward_mean:.2f}", kl=f"{log.kl:.2f}")
        if on_step is not None:
            on_step(log)
    return logs


def _response_text(history: TextHistory) -> str:
    return history.text[history.text_spans[0][1] :]


# --------------------------------------------------------------------------------------------- reporting
def summarise(logs: Sequence[StepLog]) -> dict:
    """Mean reward over the first and the last tenth of the steps (at least one step each) and the final KL."""
    window = max(1, len(logs) // 10)
    rewards = [log.reward_mean for log in logs]
    return {
        "steps": len(logs),
        "window": window,
        "first_reward": sum(rewards[:window]) / window,
        "last_reward": sum(rewards[-window:]) / window,
        "final_kl": logs[-1].kl,
    }


def print_summary(name: str, summary: dict, args, held_out: str, log_dir: str | Path) -> None:
    """Print an example run's summary (what the smoke tests check).

    Args:
        name: the example's name, shown in the header.
        summary: from `summarise`, plus `seconds` and optionally `held_out_accuracy`.
        args: the example's parsed arguments (`batch_size`, `model`, `lora`, `lr`, `eval_tasks`, `save_dir`).
        held_out: what the held-out tasks are, e.g. `"held-out problems"`.
        log_dir: where the tensorboard logs went.
    """
    print(f"\n=== {name} PPO summary ===")
    print(f"steps: {summary['steps']} x {args.batch_size} episodes, model: {args.model}, lora: {args.lora}, lr: {args.lr}")
    print(
        f"mean reward: first {summary['window']} step(s) {summary['first_reward']:.3f}, "
        f"last {summary['window']} step(s) {summary['last_reward']:.3f}; final KL {summary['final_kl']:.3f}"
    )
    if "held_out_accuracy" in summary:
        print(f"held-out accuracy (greedy, {args.eval_tasks} {held_out}): {summary['held_out_accuracy']:.1%}")
    print(f"wall time: {summary['seconds']:.1f} s, peak memory: {peak_memory_mb():.0f} MiB")
    print(f"tensorboard logs: {log_dir}" + (f"; model saved to {args.save_dir}" if args.save_dir else ""))


def peak_memory_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux `ru_maxrss` is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Mean of each value and up to `window - 1` values before it."""
    averages = []
    for index in range(len(values)):
        chunk = values[max(0, index - window + 1) : index + 1]
        averages.append(sum(chunk) / len(chunk))
    return averages


def plot_reward_curve(logs: Sequence[StepLog], path: str | Path, held_out: dict[str, float] | None = None) -> Path:
    """Save a PNG of the mean training reward per PPO step (and its moving average), with optional
    horizontal lines for held-out accuracies (`{"label": accuracy}`).

    Returns:
        The path of the PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = [log.step + 1 for log in logs]
    rewards = [log.reward_mean for log in logs]
    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot(steps, rewards, marker="o", alpha=0.5, label="training reward (sampled)")
    axis.plot(steps, moving_average(rewards, 4), linewidth=2, label="moving average (4 steps)")
    for (label, accuracy), style in zip((held_out or {}).items(), ("--", ":", "-.", "--")):
        axis.axhline(accuracy, linestyle=style, color="grey", label=label)
    axis.set_xlabel("PPO step")
    axis.set_ylabel("mean reward (exact match)")
    axis.set_ylim(-0.02, 1.02)
    axis.set_title("Calculator agent: reward during PPO")
    axis.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
