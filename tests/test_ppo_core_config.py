"""PPOConfig: legacy TRL's defaults, its checks, its legacy aliases and its flat dict."""

import math
import warnings

import pytest

from textenv.ppo import PPOConfig


# --------------------------------------------------------------------------------------------------
# PPOConfig
# --------------------------------------------------------------------------------------------------
def test_config_defaults_match_legacy():
    config = PPOConfig()
    expected = dict(
        seed=0, log_with=None, model_name="gpt2", steps=20000, learning_rate=1.41e-5, adap_kl_ctrl=True,
        init_kl_coef=0.2, kl_penalty="kl", target=6.0, horizon=10000.0, gamma=1.0, lam=0.95, cliprange=0.2,
        cliprange_value=0.2, vf_coef=0.1, batch_size=128, mini_batch_size=128, gradient_accumulation_steps=1,
        ppo_epochs=4, max_grad_norm=None, optimize_device_cache=False, early_stopping=False, target_kl=1.0,
        compare_steps=1, ratio_threshold=10.0, use_score_scaling=False, use_score_norm=False, score_clip=None,
        whiten_rewards=False, gradient_checkpointing=False, tracker_project_name="trl",
        query_dataset="stanfordnlp/imdb", reward_model="sentiment-analysis:lvwerra/distilbert-imdb",
        remove_unused_columns=True,
    )
    for name, value in expected.items():
        assert getattr(config, name) == value, name
    assert config.backward_batch_size == 128
    assert config.total_ppo_epochs == math.ceil(20000 / 128)


def test_config_emits_no_future_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PPOConfig(batch_size=4, mini_batch_size=2)


def test_config_batch_size_must_be_multiple_of_backward_batch():
    with pytest.raises(ValueError, match="multiple"):
        PPOConfig(batch_size=2, mini_batch_size=2, gradient_accumulation_steps=2)
    config = PPOConfig(batch_size=8, mini_batch_size=2, gradient_accumulation_steps=2)
    assert config.backward_batch_size == 4


def test_config_rejects_unknown_kl_penalty():
    with pytest.raises(ValueError, match="kl_penalty"):
        PPOConfig(kl_penalty="kld")
    assert PPOConfig(kl_penalty="full").kl_penalty == "full"


def test_config_legacy_aliases_are_honoured():
    config = PPOConfig(batch_size=8, forward_batch_size=4, optimize_cuda_cache=True)
    assert config.mini_batch_size == 4
    assert config.optimize_device_cache is True


def test_config_to_dict_is_flat():
    config = PPOConfig(accelerator_kwargs={"mixed_precision": "no"}, tracker_kwargs={"wandb": {"name": "x"}})
    flat = config.to_dict()
    assert flat["accelerator_kwargs/mixed_precision"] == "no"
    assert flat["tracker_kwargs/wandb/name"] == "x"
    assert flat["learning_rate"] == 1.41e-5
    assert not any(isinstance(v, dict) and v for v in flat.values())
