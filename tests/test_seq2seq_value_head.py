"""AutoModelForSeq2SeqLMWithValueHead on tiny models of every encoder-decoder architecture that TRL 0.11.4's
tests used (ALL_SEQ2SEQ_MODELS), built from configs.

Tolerances: none. The wrapper's logits and values are those of its model's own forward on the same inputs (the
same attention masks included, so the same kernels): `torch.equal`, as are weights saved and loaded, sliced
logits (the decoder runs on every position either way), and generated tokens.
"""

import json
import warnings

import pytest
import torch
import transformers
from safetensors import safe_open
from transformers import AutoModelForSeq2SeqLM

from textenv.ppo.seq2seq_value_head import AutoModelForSeq2SeqLMWithValueHead

BART_LIKE = dict(
    vocab_size=99, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
    encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
    decoder_start_token_id=2,
)
T5_LIKE = dict(vocab_size=99, d_model=16, d_ff=32, d_kv=8, num_layers=1, num_decoder_layers=1, num_heads=2, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
CONFIGS = {
    "Bart": ("BartConfig", BART_LIKE),
    "BigBirdPegasus": ("BigBirdPegasusConfig", dict(BART_LIKE, attention_type="original_full")),
    "Blenderbot": ("BlenderbotConfig", BART_LIKE),
    "BlenderbotSmall": ("BlenderbotSmallConfig", BART_LIKE),
    "FSMT": ("FSMTConfig", dict(
        {k: v for k, v in BART_LIKE.items() if k != "vocab_size"}, langs=["en", "de"], src_vocab_size=99, tgt_vocab_size=99,
    )),
    "LED": ("LEDConfig", dict(BART_LIKE, max_encoder_position_embeddings=64, max_decoder_position_embeddings=64, attention_window=4)),
    "LongT5": ("LongT5Config", dict(T5_LIKE, local_radius=2, global_block_size=4)),
    "M2M100": ("M2M100Config", BART_LIKE),
    "Marian": ("MarianConfig", dict(BART_LIKE, decoder_start_token_id=1)),
    "MBart": ("MBartConfig", BART_LIKE),
    "MT5": ("MT5Config", T5_LIKE),
    "Mvp": ("MvpConfig", BART_LIKE),
    "Pegasus": ("PegasusConfig", BART_LIKE),
    "PegasusX": ("PegasusXConfig", dict(BART_LIKE, num_global_tokens=4, block_size=4, stagger_local_blocks=False)),
    "PLBart": ("PLBartConfig", BART_LIKE),
    "ProphetNet": ("ProphetNetConfig", dict(
        vocab_size=99, hidden_size=16, encoder_ffn_dim=32, decoder_ffn_dim=32, num_encoder_layers=1, num_decoder_layers=1,
        num_encoder_attention_heads=2, num_decoder_attention_heads=2, max_position_embeddings=64, ngram=2, num_buckets=8,
        relative_max_distance=16, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=0,
    )),
    "SwitchTransformers": ("SwitchTransformersConfig", dict(T5_LIKE, num_experts=2, expert_capacity=4, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1)),
    "T5": ("T5Config", T5_LIKE),
}
INPUT_IDS = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18]])
DECODER_IDS = torch.tensor([[2, 21, 22, 23, 24], [2, 25, 26, 27, 28]])
HEAD_KEYS = ["v_head.summary.weight", "v_head.summary.bias"]


def build(name, seed=0):
    config_class, kwargs = CONFIGS[name]
    config = getattr(transformers, config_class)(**kwargs)
    torch.manual_seed(seed)
    return AutoModelForSeq2SeqLM.from_config(config).eval()


def wrap(name, seed=0, **kwargs):
    torch.manual_seed(seed + 100)
    return AutoModelForSeq2SeqLMWithValueHead.from_pretrained(build(name, seed), **kwargs).eval()


def assert_same_weights(model, other):
    for (name, param), (other_name, other_param) in zip(model.named_parameters(), other.named_parameters()):
        assert name == other_name
        assert torch.equal(other_param, param), name


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_forward_and_generate(name):
    model = wrap(name)
    assert model.is_encoder_decoder is True and not model.is_peft_model
    masks = dict(attention_mask=torch.ones_like(INPUT_IDS), decoder_attention_mask=torch.ones_like(DECODER_IDS))
    outputs = model(INPUT_IDS, decoder_input_ids=DECODER_IDS, **masks)
    assert len(outputs) == 3
    logits, loss, value = outputs
    assert logits.dtype == torch.float32 and logits.shape == (2, 5, model.config.vocab_size) and loss is None
    reference = model.pretrained_model(input_ids=INPUT_IDS, decoder_input_ids=DECODER_IDS, output_hidden_states=True, use_cache=False, **masks)
    assert torch.equal(logits, reference.logits.float())
    assert torch.equal(value, model.v_head(reference.decoder_hidden_states[-1]).squeeze(-1))
    assert value.shape == (2, 5)
    kwargs = dict(max_new_tokens=3, do_sample=False, max_length=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        generated = model.generate(INPUT_IDS, decoder_input_ids=DECODER_IDS[:, :2], **kwargs)
        expected = model.pretrained_model.generate(INPUT_IDS, decoder_input_ids=DECODER_IDS[:, :2], **kwargs)
    assert torch.equal(generated, expected) and generated.shape[1] > 2


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_save_and_load(name, tmp_path):
    model = wrap(name)
    model.save_pretrained(tmp_path)
    stored = set()
    for path in tmp_path.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as handle:
            stored |= set(handle.keys())
    assert set(HEAD_KEYS) <= stored
    assert_same_weights(model, AutoModelForSeq2SeqLMWithValueHead.from_pretrained(tmp_path))
    transformers_model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)  # ignores v_head.*
    for key, value in model.pretrained_model.state_dict().items():
        assert torch.equal(transformers_model.state_dict()[key], value), key


def test_state_dict_layout_and_both_layouts_load():
    model, other = wrap("T5", seed=0), wrap("T5", seed=1)
    state = model.state_dict()
    assert list(state) == list(model.pretrained_model.state_dict()) + HEAD_KEYS
    other.load_state_dict(state)
    assert_same_weights(model, other)
    prefixed = {k if k.startswith("v_head.") else f"pretrained_model.{k}": v for k, v in wrap("T5", seed=2).state_dict().items()}
    other.load_state_dict(prefixed)
    assert_same_weights(wrap("T5", seed=2), other)


def test_sharded_save(tmp_path):
    model = wrap("Bart")
    model.save_pretrained(tmp_path, max_shard_size="10KB")
    weight_map = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(HEAD_KEYS) <= set(weight_map) and len(set(weight_map.values())) > 1
    assert_same_weights(model, AutoModelForSeq2SeqLMWithValueHead.from_pretrained(tmp_path))


@pytest.mark.parametrize("name", ["T5", "Bart"])
def test_bf16_kwarg(name, tmp_path):
    wrap(name).save_pretrained(tmp_path)
    model = AutoModelForSeq2SeqLMWithValueHead.from_pretrained(tmp_path, torch_dtype=torch.bfloat16)
    assert model.pretrained_model.lm_head.weight.dtype == torch.bfloat16
    logits, _, value = model(input_ids=INPUT_IDS[:, :4], decoder_input_ids=INPUT_IDS[:, :4])
    assert logits.dtype == torch.float32 and value.dtype == torch.float32


def test_legacy_attributes_and_options():
    cls = AutoModelForSeq2SeqLMWithValueHead
    assert cls.transformers_parent_class is AutoModelForSeq2SeqLM
    assert cls.lm_head_namings == ["lm_head", "embed_out", "output_projection"]
    assert cls.supported_args == ("summary_dropout_prob", "v_head_initializer_range", "v_head_init_strategy")
    base = build("T5")
    base.config.summary_dropout_prob = 0.5
    assert cls.from_pretrained(base, summary_dropout_prob=0.2).v_head.dropout.p == 0.5
    model = cls.from_pretrained(build("Bart"), v_head_init_strategy="normal", v_head_initializer_range=0.5)
    assert model.v_head.summary.bias.abs().sum() == 0 and model.v_head.dropout.p == 0.1
    assert model.v_head.summary.in_features == 16 and model.transformers_model is model.pretrained_model


def test_logits_to_keep_slices_the_decoder_positions():
    model = wrap("T5")
    full_logits, _, full_value = model(input_ids=INPUT_IDS, decoder_input_ids=DECODER_IDS)
    logits, _, value = model(input_ids=INPUT_IDS, decoder_input_ids=DECODER_IDS, logits_to_keep=slice(1, 4))
    assert torch.equal(logits, full_logits[:, 1:4]) and torch.equal(value, full_value)
    assert torch.equal(model(input_ids=INPUT_IDS, decoder_input_ids=DECODER_IDS, logits_to_keep=2)[0], full_logits[:, -2:])


def test_model_without_lm_head_is_refused():
    from transformers import BartConfig, BartModel, T5Config, T5Model

    with pytest.raises(ValueError, match="language model head"):
        AutoModelForSeq2SeqLMWithValueHead.from_pretrained(T5Model(T5Config(**T5_LIKE)))
    with pytest.raises(ValueError, match="language model head"):
        AutoModelForSeq2SeqLMWithValueHead(BartModel(BartConfig(**BART_LIKE)))


def test_peft_seq2seq_model(tmp_path):
    from peft import LoraConfig

    build("T5").save_pretrained(tmp_path / "base")
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q", "v"], task_type="SEQ_2_SEQ_LM")
    model = AutoModelForSeq2SeqLMWithValueHead.from_pretrained(str(tmp_path / "base"), peft_config=lora).eval()
    assert model.is_peft_model and model.is_encoder_decoder
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()
    model.save_pretrained(tmp_path / "policy")
    assert sorted(torch.load(tmp_path / "policy" / "pytorch_model.bin", weights_only=True)) == sorted(HEAD_KEYS)
    loaded = AutoModelForSeq2SeqLMWithValueHead.from_pretrained(str(tmp_path / "policy")).eval()
    assert loaded.is_peft_model
    assert_same_weights(model, loaded)
    assert torch.equal(loaded(input_ids=INPUT_IDS, decoder_input_ids=DECODER_IDS)[0],
                       model(input_ids=INPUT_IDS, decoder_input_ids=DECODER_IDS)[0])
