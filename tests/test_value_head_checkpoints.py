"""Value-head models: legacy TRL's state-dict layout and checkpoint files (written by textenv, by legacy TRL's
rules, and by earlier textenv versions), PEFT checkpoints, accelerate checkpoints and loading kwargs.

Tolerances: none. Saving and loading copy float32 values bit for bit (safetensors, torch.save, accelerate's
state), so every weight comparison is `torch.equal` and every scalar ``==``.
"""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from textenv.ppo import AutoModelForCausalLMWithValueHead
from textenv.testing import tiny_causal_lm

VOCAB = 256
IDS = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 13, 14]])
HEAD_KEYS = ["v_head.summary.weight", "v_head.summary.bias"]


def make(seed=0):
    torch.manual_seed(seed + 100)
    return AutoModelForCausalLMWithValueHead(tiny_causal_lm(vocab_size=VOCAB, seed=seed)).eval()


def assert_same_weights(model, other):
    for (name, param), (other_name, other_param) in zip(model.named_parameters(), other.named_parameters()):
        assert name == other_name
        assert torch.equal(other_param, param), name


def lora(**kwargs):
    from peft import LoraConfig

    settings = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "task_type": "CAUSAL_LM", **kwargs}
    return LoraConfig(**settings)


def randomise_lora(model):
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()


# ------------------------------------------------------------------------------------------------ state dict
def test_state_dict_has_the_legacy_layout():
    model = make()
    state = model.state_dict()
    base_keys = list(model.pretrained_model.state_dict())
    assert list(state) == base_keys + HEAD_KEYS  # the wrapped model's own keys, no "pretrained_model." prefix
    assert state["model.norm.weight"].data_ptr() == model.pretrained_model.model.norm.weight.data_ptr()
    assert torch.equal(state["v_head.summary.weight"], model.v_head.summary.weight)
    names = [name for name, _ in model.named_parameters()]
    assert names[0] == "pretrained_model.model.embed_tokens.weight" and names[-2:] == HEAD_KEYS
    assert model.get_parameter("pretrained_model.model.norm.weight") is model.pretrained_model.model.norm.weight
    assert state._metadata[""] == {"version": 1} and "model.layers.0" in state._metadata


@pytest.mark.parametrize("layout", ["legacy", "prefixed"])
def test_load_state_dict_accepts_both_layouts(layout):
    source, target = make(seed=0), make(seed=1)
    state = source.state_dict()
    if layout == "prefixed":
        state = {k if k.startswith("v_head.") else f"pretrained_model.{k}": v for k, v in state.items()}
    assert not torch.equal(target.v_head.summary.weight, source.v_head.summary.weight)
    result = target.load_state_dict(state, strict=True)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert_same_weights(source, target)


def test_incompatible_keys_are_reported_in_the_legacy_layout():
    state = make().state_dict()
    del state["model.norm.weight"]
    state["model.extra.weight"] = torch.zeros(1)
    result = make(seed=1).load_state_dict(state, strict=False)
    assert result.missing_keys == ["model.norm.weight"]
    assert result.unexpected_keys == ["model.extra.weight"]
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "model.norm.weight"'):
        make(seed=1).load_state_dict(state)


def test_layout_composes_with_an_outer_module():
    outer = torch.nn.ModuleDict({"module": make(seed=0)})  # as DDP / accelerate wrappers nest it
    state = outer.state_dict()
    assert list(state)[0] == "module.model.embed_tokens.weight" and list(state)[-2:] == [f"module.{k}" for k in HEAD_KEYS]
    other = torch.nn.ModuleDict({"module": make(seed=1)})
    other.load_state_dict(state)
    assert_same_weights(outer["module"], other["module"])


def test_safetensors_load_model_sees_consistent_tied_names(tmp_path):
    # accelerate's save_state/load_state use safetensors' save_model/load_model, which match the tied
    # lm_head/embedding names of state_dict() against the keys load_state_dict reports missing.
    from safetensors.torch import load_model, save_model

    source, target = make(seed=0), make(seed=1)
    save_model(source, str(tmp_path / "model.safetensors"))
    missing, unexpected = load_model(target, str(tmp_path / "model.safetensors"), strict=True)
    assert not missing and not unexpected
    assert_same_weights(source, target)


@pytest.mark.parametrize("peft", [False, True])
def test_accelerate_save_state_and_load_state_restore_everything(tmp_path, peft):
    from accelerate import Accelerator

    def build(seed):
        model = make(seed=0)  # same base weights; the trained parts differ by seed
        if peft:
            from peft import get_peft_model

            model = AutoModelForCausalLMWithValueHead(get_peft_model(model.pretrained_model, lora()))
        torch.manual_seed(seed)
        with torch.no_grad():
            for param in model.parameters():
                if param.requires_grad:
                    param.normal_()
        return model

    saved_accelerator = Accelerator(cpu=True)
    saved = saved_accelerator.prepare(build(seed=1))
    saved_accelerator.save_state(str(tmp_path / "checkpoint"), safe_serialization=True)
    with safe_open(str(tmp_path / "checkpoint" / "model.safetensors"), framework="pt") as handle:
        keys = set(handle.keys())
    assert set(HEAD_KEYS) <= keys and not any(k.startswith("pretrained_model.") for k in keys)
    assert any("lora_A" in k for k in keys) == peft  # legacy TRL saved only v_head.* here for a PEFT model
    accelerator = Accelerator(cpu=True)
    restored = accelerator.prepare(build(seed=2))
    assert not torch.equal(restored.v_head.summary.weight, saved.v_head.summary.weight)
    accelerator.load_state(str(tmp_path / "checkpoint"))
    assert_same_weights(saved, restored)


# ------------------------------------------------------------------------------------------------ textenv -> files
def test_save_pretrained_writes_the_legacy_layout(tmp_path):
    model = make()
    model.save_pretrained(tmp_path)
    assert not (tmp_path / "value_head.safetensors").exists()
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as handle:
        stored = {key: handle.get_tensor(key) for key in handle.keys()}
    base_state = model.pretrained_model.state_dict()
    assert set(stored) == (set(base_state) - {"lm_head.weight"}) | set(HEAD_KEYS)  # the tied head is stored once
    for key in HEAD_KEYS:
        assert torch.equal(stored[key], model.state_dict()[key])
    transformers_model = AutoModelForCausalLM.from_pretrained(tmp_path)  # ignores the v_head.* keys
    for key, value in base_state.items():
        assert torch.equal(transformers_model.state_dict()[key], value), key
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path)
    assert_same_weights(model, loaded)


def test_save_pretrained_sharded(tmp_path):
    model = make()
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert not (tmp_path / "model.safetensors").exists() and len(set(index["weight_map"].values())) > 1
    assert set(HEAD_KEYS) <= set(index["weight_map"])
    transformers_model = AutoModelForCausalLM.from_pretrained(tmp_path)
    for key, value in model.pretrained_model.state_dict().items():
        assert torch.equal(transformers_model.state_dict()[key], value), key
    assert_same_weights(model, AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path))


def test_save_pretrained_honours_a_given_state_dict(tmp_path):
    model = make()
    state = model.state_dict()
    state["v_head.summary.bias"] = torch.tensor([7.0])
    model.save_pretrained(tmp_path, state_dict=state)
    assert AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path).v_head.summary.bias.item() == 7.0
    assert model.state_dict()["v_head.summary.bias"].item() != 7.0


# ------------------------------------------------------------------------------------------------ files -> textenv
def legacy_state(model):
    """What legacy TRL's save_pretrained handed to transformers: base keys + v_head.*, tied head dropped."""
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    return state


def write_sharded(folder, state, suffix):
    keys = list(state)
    shards = {f"model-0000{i + 1}-of-00002.{suffix}": keys[i::2] for i in range(2)}
    if suffix == "bin":
        shards = {name.replace("model-", "pytorch_model-"): shard_keys for name, shard_keys in shards.items()}
    for name, shard_keys in shards.items():
        shard = {key: state[key] for key in shard_keys}
        save_file(shard, str(folder / name), metadata={"format": "pt"}) if suffix == "safetensors" else torch.save(shard, folder / name)
    index_name = "model.safetensors.index.json" if suffix == "safetensors" else "pytorch_model.bin.index.json"
    weight_map = {key: name for name, shard_keys in shards.items() for key in shard_keys}
    (folder / index_name).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("layout", ["safetensors", "bin", "sharded-safetensors", "sharded-bin", "old-textenv"])
def test_from_pretrained_reads_the_value_head_of_each_layout(tmp_path, layout):
    model = make()
    with torch.no_grad():
        model.v_head.summary.bias.fill_(3.5)
    model.pretrained_model.config.save_pretrained(tmp_path)
    state = legacy_state(model)
    if layout == "safetensors":
        save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    elif layout == "bin":
        torch.save(state, tmp_path / "pytorch_model.bin")
    elif layout.startswith("sharded"):
        write_sharded(tmp_path, state, layout.split("-")[1])
    else:  # textenv before the legacy layout: the plain model, and the head in its own file
        base_state = {k: v for k, v in state.items() if not k.startswith("v_head.")}
        save_file(base_state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
        head = {k: v for k, v in state.items() if k.startswith("v_head.")}
        save_file(head, str(tmp_path / "value_head.safetensors"), metadata={"format": "pt"})
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path)
    assert loaded.v_head.summary.bias.item() == 3.5
    assert_same_weights(model, loaded)


def test_from_pretrained_of_a_plain_checkpoint_starts_a_fresh_head(tmp_path):
    base = tiny_causal_lm(vocab_size=VOCAB)
    base.save_pretrained(tmp_path)
    torch.manual_seed(5)
    first = AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path)
    torch.manual_seed(6)
    second = AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path)
    assert not torch.equal(first.v_head.summary.weight, second.v_head.summary.weight)
    assert first.v_head.summary.bias.abs().sum() > 0  # legacy: random init, not zeros


def test_save_replaces_an_old_value_head_file(tmp_path):
    old, new = make(seed=0), make(seed=1)
    save_file({f"v_head.{k}": v for k, v in old.v_head.state_dict().items()}, str(tmp_path / "value_head.safetensors"))
    new.save_pretrained(tmp_path)
    assert not (tmp_path / "value_head.safetensors").exists()
    assert_same_weights(new, AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path))


# ------------------------------------------------------------------------------------------------ PEFT
def test_peft_save_layout_and_reload(tmp_path):
    base = tiny_causal_lm(vocab_size=VOCAB)
    base.save_pretrained(tmp_path / "base")
    model = AutoModelForCausalLMWithValueHead.from_pretrained(str(tmp_path / "base"), peft_config=lora())
    randomise_lora(model)
    model.save_pretrained(tmp_path / "policy")
    folder = tmp_path / "policy"
    assert (folder / "adapter_config.json").is_file() and (folder / "adapter_model.safetensors").is_file()
    assert not (folder / "model.safetensors").exists()
    head = torch.load(folder / "pytorch_model.bin", weights_only=True)
    assert sorted(head) == sorted(HEAD_KEYS)  # legacy: pytorch_model.bin holds only the value head
    assert torch.equal(head["v_head.summary.weight"], model.v_head.summary.weight)

    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(str(folder), is_trainable=True)
    assert loaded.is_peft_model
    assert_same_weights(model, loaded)
    assert all(p.requires_grad for n, p in loaded.named_parameters() if "lora_" in n)
    frozen = AutoModelForCausalLMWithValueHead.from_pretrained(str(folder))  # legacy default: is_trainable=False
    assert not any(p.requires_grad for n, p in frozen.named_parameters() if "lora_" in n)
    peft_state = model.state_dict()
    assert any("lora_A.default" in k for k in peft_state) and list(peft_state)[-2:] == HEAD_KEYS


# ------------------------------------------------------------------------------------------------ kwargs
@pytest.mark.parametrize("kwarg", ["torch_dtype", "dtype"])
def test_bf16_kwarg(tmp_path, kwarg):
    make().save_pretrained(tmp_path)
    seen = {}

    class Recording(AutoModelForCausalLM):
        @classmethod
        def from_pretrained(cls, *args, **kwargs):
            seen.update(kwargs)
            return AutoModelForCausalLM.from_pretrained(*args, **kwargs)

    class Wrapper(AutoModelForCausalLMWithValueHead):
        transformers_parent_class = Recording

    model = Wrapper.from_pretrained(tmp_path, **{kwarg: torch.bfloat16})
    assert seen == {"dtype": torch.bfloat16}  # transformers 5 name; torch_dtype would log a deprecation
    assert model.pretrained_model.lm_head.weight.dtype == torch.bfloat16
    assert model.pretrained_model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    assert model.v_head.summary.weight.dtype == torch.float32  # as legacy: the head stays float32
    logits, _, value = model(IDS)
    assert logits.dtype == torch.float32 and value.dtype == torch.float32


def test_legacy_loading_kwargs_are_accepted(tmp_path):
    make().save_pretrained(tmp_path)
    model = AutoModelForCausalLMWithValueHead.from_pretrained(
        tmp_path, token=None, is_trainable=True, reward_adapter_name="rm", use_gradient_checkpointing=False
    )
    assert model.supports_rm_adapter is False
    with pytest.raises(ValueError, match="reward_adapter can only be used with a PeftModel"):
        AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path, reward_adapter=str(tmp_path))
    with pytest.raises(ValueError, match="`reward_adapter` argument should be a string"):
        AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path, reward_adapter=123)
    with pytest.raises(ValueError, match="peft.PeftConfig"):
        AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path, peft_config={"r": 4})


def test_peft_config_for_a_peft_model_is_ignored_with_a_warning():
    from peft import get_peft_model

    peft_model = get_peft_model(tiny_causal_lm(vocab_size=VOCAB), lora())
    with pytest.warns(UserWarning, match="already a PeftModel"):
        model = AutoModelForCausalLMWithValueHead.from_pretrained(peft_model, peft_config=lora(r=8))
    assert model.pretrained_model is peft_model and model.is_peft_model


def test_prompt_learning_adapters_are_refused():
    from peft import PrefixTuningConfig, get_peft_model

    prefix = get_peft_model(tiny_causal_lm(vocab_size=VOCAB), PrefixTuningConfig(num_virtual_tokens=2, task_type="CAUSAL_LM"))
    with pytest.raises(ValueError, match="PromptLearningConfig"):
        AutoModelForCausalLMWithValueHead.from_pretrained(prefix)
