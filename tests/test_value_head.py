"""AutoModelForCausalLMWithValueHead and create_reference_model (checkpoint files and the state-dict layout:
test_value_head_checkpoints.py; the reward adapter: test_value_head_reward_adapter.py; the seq2seq wrapper:
test_seq2seq_value_head.py).

Tolerances: exact (`torch.equal`) wherever both sides run the same kernels on the same inputs: the wrapper's
logits and LM loss against its causal LM's own forward, generation, a saved and reloaded model, a PEFT model
against its saved and reloaded adapter, a reference model against the policy it copies. The one comparison of
two computations that are equal only in exact arithmetic, logits of kept positions against a slice of all
positions' (the LM head's product runs on another number of rows), is made in float64 within
`assert_reordered_close` of `forward_terms`. The bounds on a value head drawn with std 0.5 (its 32 weights'
sample std between 0.2 and 0.9) are more than 4.8 standard deviations of the sample std wide.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, OPTConfig, OPTForCausalLM

from textenv.ppo import AutoModelForCausalLMWithValueHead, create_reference_model
from textenv.ppo.value_head import ValueHead, value_head_hidden_size
from textenv.testing import tiny_causal_lm

from numerics import assert_reordered_close, float64_model, forward_terms

INPUT_IDS = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])


@pytest.fixture()
def wrapped():
    torch.manual_seed(0)
    return AutoModelForCausalLMWithValueHead(tiny_causal_lm(seed=0)).eval()


def test_forward_returns_logits_loss_value(wrapped):
    outputs = wrapped(input_ids=INPUT_IDS)
    assert len(outputs) == 3
    logits, loss, value = outputs
    assert logits.shape == (2, 6, 49152) and logits.dtype == torch.float32
    assert loss is None
    assert value.shape == (2, 6)
    assert torch.equal(logits, wrapped.pretrained_model(input_ids=INPUT_IDS).logits)


def test_forward_with_labels_returns_lm_loss(wrapped):
    _, loss, _ = wrapped(input_ids=INPUT_IDS, labels=INPUT_IDS)
    expected = wrapped.pretrained_model(input_ids=INPUT_IDS, labels=INPUT_IDS).loss
    assert torch.equal(loss, expected)


def test_forward_returns_past_key_values(wrapped):
    outputs = wrapped(input_ids=INPUT_IDS, return_past_key_values=True, use_cache=True)
    assert len(outputs) == 4 and outputs[3] is not None


def test_logits_to_keep_matches_full_forward(wrapped):
    """In float64: the LM head multiplies fewer rows, which may take another kernel (equal in exact arithmetic)."""
    wrapped = float64_model(wrapped)
    full_logits, _, full_value = wrapped(input_ids=INPUT_IDS)
    logits, _, value = wrapped(input_ids=INPUT_IDS, logits_to_keep=slice(2, 5))
    assert logits.shape == (2, 3, 49152)
    terms = forward_terms(wrapped.config, INPUT_IDS.shape[1])
    assert_reordered_close(logits, full_logits[:, 2:5], terms, "kept logits")
    assert_reordered_close(value, full_value, terms, "values")
    last_two, _, _ = wrapped(input_ids=INPUT_IDS, logits_to_keep=2)
    assert_reordered_close(last_two, full_logits[:, -2:], terms, "last two logits")


def test_value_head_default_init_has_nonzero_bias(wrapped):
    assert wrapped.v_head.summary.bias.abs().sum() != 0
    assert isinstance(wrapped.v_head.dropout, torch.nn.Dropout) and wrapped.v_head.dropout.p == 0.1


def test_value_head_options():
    model = AutoModelForCausalLMWithValueHead(
        tiny_causal_lm(), summary_dropout_prob=0.0, v_head_init_strategy="normal", v_head_initializer_range=0.5
    )
    assert isinstance(model.v_head.dropout, torch.nn.Identity)
    assert model.v_head.summary.bias.abs().sum() == 0
    assert 0.2 < model.v_head.summary.weight.std().item() < 0.9
    with pytest.raises(ValueError, match="v_head_init_strategy"):
        AutoModelForCausalLMWithValueHead(tiny_causal_lm(), v_head_init_strategy="zeros")


def test_wrapper_is_not_marked_encoder_decoder(wrapped):
    # TextEnvironment (legacy) decides encoder-decoder with hasattr(model, "is_encoder_decoder").
    assert not hasattr(wrapped, "is_encoder_decoder")
    assert wrapped.pretrained_model.device.type == "cpu"


def test_generate_delegates(wrapped):
    kwargs = dict(max_new_tokens=3, do_sample=False, pad_token_id=2)
    assert torch.equal(wrapped.generate(INPUT_IDS[:1], **kwargs), wrapped.pretrained_model.generate(INPUT_IDS[:1], **kwargs))


def test_save_and_load_round_trip(wrapped, tmp_path):
    wrapped.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and not (tmp_path / "value_head.safetensors").exists()
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(str(tmp_path))
    original, restored = wrapped.state_dict(), loaded.state_dict()
    assert original.keys() == restored.keys()
    for key in original:
        assert torch.equal(restored[key], original[key]), key


def test_from_pretrained_accepts_a_loaded_model():
    base = tiny_causal_lm()
    model = AutoModelForCausalLMWithValueHead.from_pretrained(base, summary_dropout_prob=0.3)
    assert model.pretrained_model is base
    assert model.v_head.dropout.p == 0.3


def test_peft_model_round_trip(tmp_path):
    from peft import LoraConfig

    base = tiny_causal_lm()
    base.save_pretrained(tmp_path / "base")
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = AutoModelForCausalLMWithValueHead.from_pretrained(str(tmp_path / "base"), peft_config=lora)
    assert model.is_peft_model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n.startswith("v_head") for n in trainable)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()
    model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(str(tmp_path / "adapter"))
    assert loaded.is_peft_model
    model.eval(), loaded.eval()
    assert torch.equal(loaded(input_ids=INPUT_IDS)[0], model(input_ids=INPUT_IDS)[0])  # the same weights, the same kernels
    assert torch.equal(loaded.v_head.summary.weight, model.v_head.summary.weight)


def test_create_reference_model_is_frozen_copy(wrapped):
    reference = create_reference_model(wrapped)
    assert not reference.training
    assert all(not p.requires_grad for p in reference.parameters())
    assert all(p.requires_grad for p in wrapped.parameters())
    for (name, p), (_, q) in zip(wrapped.named_parameters(), reference.named_parameters()):
        assert torch.equal(p, q), name
        assert p.data_ptr() != q.data_ptr(), name


def test_create_reference_model_shares_lower_layers(wrapped):
    reference = create_reference_model(wrapped, num_shared_layers=1)
    policy_params = dict(wrapped.named_parameters())
    reference_params = dict(reference.named_parameters())
    shared = [n for n in policy_params if policy_params[n] is reference_params[n]]
    assert shared, "nothing is shared"
    assert all(".layers.1." not in n and "v_head" not in n and not n.endswith("model.norm.weight") for n in shared)
    assert "pretrained_model.model.embed_tokens.weight" in shared
    assert any(".layers.0." in n for n in shared)
    for name, param in policy_params.items():
        assert param.requires_grad == (name not in shared), name
        if ".layers.1." in name:
            assert reference_params[name].data_ptr() != param.data_ptr()
    assert all(not p.requires_grad for p in reference.parameters())


def test_create_reference_model_custom_pattern_and_errors(wrapped):
    reference = create_reference_model(wrapped, num_shared_layers=1, pattern="model.layers.{layer}")
    assert reference.pretrained_model.model.layers[0].mlp.up_proj.weight is wrapped.pretrained_model.model.layers[0].mlp.up_proj.weight
    with pytest.raises(ValueError, match="not found"):
        create_reference_model(wrapped, num_shared_layers=1, pattern="decoder.blocks.{layer}")


# ------------------------------------------------------------------------------------------------ legacy API
def tiny_gpt2(seed=0, **overrides):
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=5, n_head=2, **overrides)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config).eval()


def test_legacy_class_and_instance_attributes(wrapped):
    cls = AutoModelForCausalLMWithValueHead
    assert cls.transformers_parent_class is AutoModelForCausalLM
    assert cls.lm_head_namings == ["lm_head", "embed_out"]
    assert cls.supported_args == ("summary_dropout_prob", "v_head_initializer_range", "v_head_init_strategy")
    assert wrapped.config is wrapped.pretrained_model.config
    assert wrapped.is_peft_model is False and wrapped.is_sequential_parallel is False
    assert wrapped.is_loaded_in_8bit is False and wrapped.is_loaded_in_4bit is False
    assert wrapped.supports_rm_adapter is False and wrapped.rm_adapter_name is None
    assert wrapped.policy_adapter_name == "default"
    assert isinstance(wrapped.v_head.flatten, torch.nn.Flatten)
    assert wrapped.causal_lm is wrapped.pretrained_model and wrapped.device.type == "cpu"


@pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning")
def test_gradient_checkpointing_and_generation_helpers_delegate(wrapped):
    wrapped.gradient_checkpointing_enable()
    assert wrapped.pretrained_model.is_gradient_checkpointing
    wrapped.gradient_checkpointing_disable()
    assert not wrapped.pretrained_model.is_gradient_checkpointing
    wrapped.enable_input_require_grads()
    embeddings = wrapped.pretrained_model.get_input_embeddings()(INPUT_IDS)
    assert embeddings.requires_grad
    inputs = wrapped.prepare_inputs_for_generation(INPUT_IDS, attention_mask=torch.ones_like(INPUT_IDS))
    assert torch.equal(inputs["input_ids"], INPUT_IDS)


def test_dropout_from_config_wins_over_the_argument():
    base = tiny_gpt2()
    base.config.summary_dropout_prob = 0.5
    assert AutoModelForCausalLMWithValueHead.from_pretrained(base, summary_dropout_prob=0.2).v_head.dropout.p == 0.5
    assert AutoModelForCausalLMWithValueHead.from_pretrained(tiny_gpt2(), summary_dropout_prob=0.2).v_head.dropout.p == 0.2
    assert AutoModelForCausalLMWithValueHead(tiny_gpt2()).v_head.dropout.p == 0.1
    assert isinstance(AutoModelForCausalLMWithValueHead(tiny_gpt2(), summary_dropout_prob=None).v_head.dropout, torch.nn.Identity)


def test_value_head_hidden_size_rules():
    from types import SimpleNamespace

    from transformers import BertConfig, EncoderDecoderConfig

    assert value_head_hidden_size(GPT2Config(n_embd=24)) == 24
    opt = OPTConfig(hidden_size=32, word_embed_proj_dim=16, ffn_dim=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=64)
    assert value_head_hidden_size(opt) == 16
    model = AutoModelForCausalLMWithValueHead(OPTForCausalLM(opt))
    assert model.v_head.summary.in_features == 16
    assert model(input_ids=INPUT_IDS % 64)[2].shape == (2, 6)  # the projected width is what the head reads
    encoder_decoder = EncoderDecoderConfig.from_encoder_decoder_configs(BertConfig(hidden_size=48), BertConfig(hidden_size=40))
    assert value_head_hidden_size(encoder_decoder) == 40
    assert value_head_hidden_size(SimpleNamespace(d_model=12)) == 12
    assert value_head_hidden_size(SimpleNamespace(n_embd=20)) == 20
    with pytest.raises(ValueError, match="hidden size"):
        value_head_hidden_size(SimpleNamespace())


def test_value_head_applies_dropout_before_the_upcast():
    head = ValueHead(GPT2Config(n_embd=16), summary_dropout_prob=0.3).train()
    hidden = torch.randn(2, 5, 16).bfloat16()
    torch.manual_seed(1)
    got = head(hidden)
    torch.manual_seed(1)
    expected = head.summary(head.dropout(hidden).float())
    assert got.dtype == torch.float32
    assert torch.equal(got, expected)


def test_model_without_lm_head_is_refused():
    from transformers import T5Config, T5Model

    with pytest.raises(ValueError, match="language model head"):
        AutoModelForCausalLMWithValueHead.from_pretrained(tiny_gpt2().transformer)
    with pytest.raises(ValueError, match="language model head"):
        AutoModelForCausalLMWithValueHead(T5Model(T5Config(vocab_size=64, d_model=16, d_ff=32, d_kv=8, num_layers=1, num_heads=2)))
    with pytest.raises(ValueError, match="string or a PreTrainedModel"):
        AutoModelForCausalLMWithValueHead.from_pretrained(42)


def test_unknown_constructor_arguments_warn():
    with pytest.warns(UserWarning, match="summary_dropout"):
        AutoModelForCausalLMWithValueHead(tiny_gpt2(), summary_dropout=0.3)


def test_device_map_checks():
    base = tiny_gpt2()
    base.hf_device_map = {"transformer": "cpu", "lm_head": "disk"}
    with pytest.raises(ValueError, match="offloaded"):
        AutoModelForCausalLMWithValueHead.from_pretrained(base)
    base.hf_device_map = {"": "cpu"}
    assert AutoModelForCausalLMWithValueHead.from_pretrained(base).is_sequential_parallel is False
    base.hf_device_map = {"transformer": 0, "lm_head": 1}  # dispatched: outputs are gathered on the head's device
    model = AutoModelForCausalLMWithValueHead.from_pretrained(base)
    assert model.is_sequential_parallel is True
    assert all(t.device.type == "cpu" for t in model(input_ids=INPUT_IDS % 64) if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("shared", [None, 1])
def test_reference_model_legacy_parameter_names(shared):
    # legacy ReferenceModelTest: parameters are addressed as "pretrained_model.transformer.h.{layer}...".
    model = AutoModelForCausalLMWithValueHead.from_pretrained(tiny_gpt2())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1)
    name = "pretrained_model.transformer.h.{}.attn.c_attn.weight"
    reference = create_reference_model(model, num_shared_layers=shared)
    before = {i: model.get_parameter(name.format(i)).detach().clone() for i in (0, 4)}
    reference_before = {i: reference.get_parameter(name.format(i)).detach().clone() for i in (0, 4)}
    ids = torch.tensor([[0, 1, 2, 3]])
    model(input_ids=ids, labels=ids)[1].backward()
    optimizer.step()
    for i in (0, 4):
        assert torch.equal(before[i], reference_before[i])
        assert torch.equal(reference.get_parameter(name.format(i)), reference_before[i])
    assert torch.equal(model.get_parameter(name.format(0)), before[0]) == (shared == 1)
    assert not torch.equal(model.get_parameter(name.format(4)), before[4])
