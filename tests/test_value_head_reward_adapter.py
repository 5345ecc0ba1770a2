"""A reward-modeling adapter loaded next to the policy adapter (legacy TRL's multi-adapter RL), after TRL 0.11.4's
test_peft_model_ppo_adapter_rm_trainer.

Tolerances: none. The reward score is the saved adapter's backbone and score head run on the same inputs with
the same kernels (the policy's own adapter is inactive, dropout off), so it equals the saved reward model's
logits bit for bit (`torch.equal`), and training the policy's adapter leaves it so; frozen weights stay
`torch.equal`. That the score differs by more than 0.01 from the reward model's before its training step (one
Adam step at lr 1e-2 on the LoRA matrices and the score head moves every weight by about 0.01, the scores by
about 0.3 here) shows the comparison can fail.
"""

import warnings

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from textenv.ppo import AutoModelForCausalLMWithValueHead
from textenv.testing import tiny_causal_lm

VOCAB = 256
INPUTS = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]])


def lora(task_type):
    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, bias="none", target_modules=["q_proj", "v_proj"], task_type=task_type)


@pytest.fixture(scope="module")
def reward_adapter(tmp_path_factory):
    """`(base folder, adapter folder, logits before training, logits of the saved adapter)` of a trained
    SEQ_CLS LoRA adapter with a `score` head."""
    folder = tmp_path_factory.mktemp("reward")
    tiny_causal_lm(vocab_size=VOCAB, seed=0).save_pretrained(folder / "base")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reward_model = get_peft_model(AutoModelForSequenceClassification.from_pretrained(folder / "base"), lora("SEQ_CLS"))
    optimizer = torch.optim.Adam([p for p in reward_model.parameters() if p.requires_grad], lr=1e-2)
    previous = reward_model(INPUTS).logits
    previous.mean().backward()
    optimizer.step()
    reward_model.eval()
    with torch.no_grad():
        original = reward_model(INPUTS).logits
    reward_model.save_pretrained(folder / "adapter")
    return folder / "base", folder / "adapter", previous.detach(), original


def policy(base_folder, reward_folder, **kwargs):
    base = AutoModelForCausalLM.from_pretrained(base_folder)
    return AutoModelForCausalLMWithValueHead.from_pretrained(get_peft_model(base, lora("CAUSAL_LM")), reward_adapter=str(reward_folder), **kwargs)


def test_reward_adapter_is_loaded_frozen_with_its_score_head(reward_adapter):
    base_folder, reward_folder, _, _ = reward_adapter
    model = policy(base_folder, reward_folder)
    assert model.supports_rm_adapter and model.rm_adapter_name == "reward_adapter"
    assert isinstance(model.score, torch.nn.Linear) and model.score.out_features == 2 and model.score.bias is None
    assert not model.score.weight.requires_grad
    reward_params = {n: p for n, p in model.named_parameters() if "reward_adapter" in n}
    assert reward_params and not any(p.requires_grad for p in reward_params.values())
    policy_params = [p for n, p in model.named_parameters() if "lora_" in n and "reward_adapter" not in n]
    assert policy_params and all(p.requires_grad for p in policy_params)
    assert policy(base_folder, reward_folder, reward_adapter_name="rm").rm_adapter_name == "rm"


def test_compute_reward_score_equals_the_saved_adapter(reward_adapter):
    base_folder, reward_folder, previous, original = reward_adapter
    model = policy(base_folder, reward_folder)
    model.train()
    scores = model.compute_reward_score(INPUTS)
    assert scores.shape == (2, 5, 2) and not scores.requires_grad
    assert torch.equal(scores[:, -1, :], original)
    assert (scores[:, -1, :] - previous).abs().max() > 0.01  # the training step moved the scores: the check can fail
    assert model.pretrained_model.active_adapter == "default" and model.training  # switched back, mode restored
    assert all(p.requires_grad == ("reward_adapter" not in n) for n, p in model.named_parameters() if "lora_" in n)


def test_policy_training_leaves_the_reward_adapter_alone(reward_adapter):
    base_folder, reward_folder, _, original = reward_adapter
    model = policy(base_folder, reward_folder)
    model.compute_reward_score(INPUTS)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    for _ in range(2):
        logits, _, values = model(input_ids=INPUTS)
        (logits.mean() + values.mean()).backward()
        optimizer.step()
    for name, param in model.named_parameters():
        if ("lora" in name or "v_head" in name) and "reward" not in name:
            assert param.grad is not None, name
        else:
            assert param.grad is None, name
    assert torch.equal(model.compute_reward_score(INPUTS)[:, -1, :], original)


def test_compute_reward_score_needs_a_reward_adapter(reward_adapter):
    base_folder, _, _, _ = reward_adapter
    model = AutoModelForCausalLMWithValueHead.from_pretrained(get_peft_model(AutoModelForCausalLM.from_pretrained(base_folder), lora("CAUSAL_LM")))
    with pytest.raises(ValueError, match="does not support reward modeling adapter"):
        model.compute_reward_score(INPUTS)


def test_reward_adapter_without_a_score_head_is_refused(reward_adapter, tmp_path):
    base_folder, _, _, _ = reward_adapter
    causal_adapter = get_peft_model(AutoModelForCausalLM.from_pretrained(base_folder), lora("CAUSAL_LM"))
    causal_adapter.save_pretrained(tmp_path / "no-score")
    with pytest.raises(ValueError, match="no score head"):
        policy(base_folder, tmp_path / "no-score")


@pytest.mark.filterwarnings("ignore:No dataset is provided")
@pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning")
def test_ppo_steps_with_a_reward_adapter(reward_adapter):
    from textenv.ppo import PPOConfig, PPOTrainer

    base_folder, reward_folder, previous, original = reward_adapter
    model = policy(base_folder, reward_folder)
    trainer = PPOTrainer(PPOConfig(batch_size=2, mini_batch_size=1, learning_rate=1e-2), model)
    assert trainer.ref_model is None  # the reference is the model with its adapters disabled
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if "reward_adapter" in n or n.startswith("score.")}
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n and "reward_adapter" not in n}
    queries, responses = [torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])], [torch.tensor([7, 8]), torch.tensor([9, 10, 11])]
    rewards = [torch.tensor(1.0), torch.tensor(0.0)]
    trainer.step(queries, responses, rewards)
    trainer.model.train()
    trainer.model.gradient_checkpointing_enable()
    trainer.step(queries, responses, rewards)
    parameters = dict(model.named_parameters())
    assert all(torch.equal(parameters[n], value) for n, value in frozen.items())
    assert any(not torch.equal(parameters[n], value) for n, value in trained.items())
    scores = trainer.model.compute_reward_score(INPUTS)[:, -1, :]
    assert torch.equal(scores, original)
    assert (scores - previous).abs().max() > 0.01
