"""Training a policy on episodes, the same way for every front end and algorithm.

- `loop`: `train(trainer, episodes, steps, on_step=...)`, the one loop (episodes -> `trainer.step` -> stats,
  logs, `run_dir` records -> weight sync), and its `StepLog`;
- `sources`: `EpisodeBatch`, the `EpisodeSource` protocol and `TextEnvironmentSource` (the Gym front end's
  source is `textenv.gym.training.GymSource`);
- `overlap`: `EpisodePipeline`, rollouts in step with training or ahead of it (``max_staleness``);
- `policy`: `load_policy`, the one policy loader, and `lora_config`;
- `settings`: `Settings` and the policy, trainer (`build_trainer`: PPO or GRPO) and seeds they give;
- `evaluation`: `evaluate` a policy on fixed tasks, sampled or greedy, `measure` it before and after training
  and `log_before_after`;
- `calculator`: the calculator job's environment and training tasks;
- `command`: `textenv train`; `hub`: pushing a trained policy to the Hugging Face Hub.

May import: textenv.environment, textenv.episodes, textenv.grpo, textenv.gym (GymSource, plugins; a cycle), textenv.hardware, textenv.logs, textenv.models, textenv.options (a cycle), textenv.parsing (textenv train's parser and settings errors), textenv.ppo, textenv.tasks, textenv.tools, textenv.view
"""

from textenv.training.calculator import build_calculator_environment, calculator_task_batches, calculator_tasks
from textenv.training.evaluation import GREEDY_KWARGS, SAMPLING_KWARGS, Evaluation, evaluate, generation_mode, log_before_after, measure, measure_environment, show_episodes
from textenv.training.loop import StepLog, train
from textenv.training.policy import LORA_TARGET_MODULES, TINY_MODEL, load_policy, lora_config
from textenv.training.settings import Settings, algorithm_summary, build_policy, build_trainer, seed_everything
from textenv.training.sources import EpisodeBatch, EpisodeSource, TextEnvironmentSource, split_text

__all__ = [
    "GREEDY_KWARGS",
    "LORA_TARGET_MODULES",
    "SAMPLING_KWARGS",
    "TINY_MODEL",
    "EpisodeBatch",
    "EpisodeSource",
    "Evaluation",
    "Settings",
    "StepLog",
    "TextEnvironmentSource",
    "build_calculator_environment",
    "build_policy",
    "algorithm_summary",
    "build_trainer",
    "calculator_task_batches",
    "calculator_tasks",
    "evaluate",
    "generation_mode",
    "load_policy",
    "log_before_after",
    "lora_config",
    "measure",
    "measure_environment",
    "seed_everything",
    "show_episodes",
    "split_text",
    "train",
]
