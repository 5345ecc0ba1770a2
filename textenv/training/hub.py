"""Pushing a trained policy to the Hugging Face Hub: the model, its tokenizer and a model card."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

CARD_TEMPLATE = """---
library_name: textenv
tags:
- textenv
- ppo
- tool-use
- reinforcement-learning
base_model: {base_model}
---

# {repo_id}

A policy trained with [textenv](https://github.com/textenv/textenv)'s `textenv train`: {algorithm} on
{task_description}, starting from `{base_model}`.

## Training

- {algorithm} steps: {steps}; episodes per step: {batch_size}; learning rate: {learning_rate}
- adapters: {adapters}
- last mean rewards: {rewards}

{contents}

## Options

```json
{options}
```
"""


def write_model_card(folder: str | Path, repo_id: str, summary: dict[str, Any]) -> Path:
    """Write ``README.md`` (a model card with the run's summary and options) into `folder`."""
    algorithm = summary.get("algorithm", "PPO")
    if algorithm == "PPO":
        contents = (f"The folder holds the policy with its value head (`v_head`) and the tokenizer. Load it with\n"
                    f"`textenv.AutoModelForCausalLMWithValueHead.from_pretrained(\"{repo_id}\")`, or the language model alone with\n"
                    f"`transformers.AutoModelForCausalLM.from_pretrained(\"{repo_id}\")`.")
    else:
        contents = (f"The folder holds the policy (no value head: {algorithm} has no critic) and the tokenizer. Load it with\n"
                    f"`transformers.AutoModelForCausalLM.from_pretrained(\"{repo_id}\")` (`peft.AutoPeftModelForCausalLM` for adapters).")
    card = CARD_TEMPLATE.format(
        repo_id=repo_id,
        algorithm=algorithm,
        contents=contents,
        base_model=summary.get("base_model", "unknown"),
        task_description=summary.get("task_description", "tool-use episodes"),
        steps=summary.get("steps", "?"),
        batch_size=summary.get("batch_size", "?"),
        learning_rate=summary.get("learning_rate", "?"),
        adapters=summary.get("adapters", "none (all weights)"),
        rewards=summary.get("rewards", []),
        options=json.dumps(summary.get("options", {}), indent=2, default=str, sort_keys=True),
    )
    path = Path(folder) / "README.md"
    path.write_text(card)
    return path


def push_folder(folder: str | Path, repo_id: str, summary: dict[str, Any], token: Optional[str] = None, private: Optional[bool] = None) -> str:
    """Write the model card into `folder`, create the repository (if needed) and upload the folder.

    Returns:
        The commit's URL as the hub reports it.
    """
    from huggingface_hub import HfApi

    write_model_card(folder, repo_id, summary)
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    commit = api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="textenv train: trained policy")
    return str(getattr(commit, "commit_url", commit))
