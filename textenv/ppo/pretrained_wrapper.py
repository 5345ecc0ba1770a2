"""[`PreTrainedModelWrapper`]: what the causal and the seq2seq value-head models share, as legacy TRL (0.11.4)
had it: loading (``from_pretrained``, including PEFT adapters and a reward adapter), saving in legacy TRL's
file layout, the legacy state-dict layout, and ``compute_reward_score``.
"""

from __future__ import annotations

import inspect
import logging
import os
import warnings
from typing import Any

import torch
from torch import nn

from textenv.ppo.reward_adapter import load_reward_adapter
from textenv.ppo.value_head_files import (
    BIN_WEIGHTS,
    OLD_VALUE_HEAD_FILE,
    CheckpointLocation,
    is_value_head_key,
    read_value_head_state,
)
from textenv.ppo.wrapper_state_dict import register_legacy_layout

logger = logging.getLogger(__name__)


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (False when peft is not installed)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


class PreTrainedModelWrapper(nn.Module):
    """A ``transformers`` model (optionally a ``peft.PeftModel``) wrapped with extra heads.

    Subclasses set ``transformers_parent_class``, ``lm_head_namings`` and ``supported_args``, and add the heads.
    ``state_dict()`` uses legacy TRL's layout (see `textenv.ppo.wrapper_state_dict`): the wrapped model's own
    keys plus ``v_head.*``; for a PEFT model the PeftModel's keys plus ``v_head.*`` (legacy returned only
    ``v_head.*``, which made accelerate checkpoints lose the adapter weights).

    Args:
        pretrained_model: the model to wrap.
        score_module: the frozen score head of a reward adapter (see [`from_pretrained`]).
        supports_rm_adapter: whether a reward adapter is loaded.
        rm_adapter_name: its adapter name.
    """

    transformers_parent_class: Any = None
    lm_head_namings: list[str] = []
    supported_args: tuple[str, ...] = ()
    supported_modules = ("v_head",)
    supported_rm_modules = ("score",)

    def __init__(
        self,
        pretrained_model: nn.Module,
        score_module: nn.Module | None = None,
        supports_rm_adapter: bool = False,
        rm_adapter_name: str | None = None,
    ):
        super().__init__()
        self.pretrained_model = pretrained_model
        self.is_peft_model = is_peft_model(pretrained_model)
        self.config = pretrained_model.config
        self.is_loaded_in_8bit = getattr(pretrained_model, "is_loaded_in_8bit", False)
        self.is_loaded_in_4bit = getattr(pretrained_model, "is_loaded_in_4bit", False)
        self.is_sequential_parallel = False
        self.supports_rm_adapter = supports_rm_adapter
        self.rm_adapter_name = rm_adapter_name
        self.policy_adapter_name = "default"
        if score_module is not None:
            self.score = score_module
        register_legacy_layout(self)

    # ---------------------------------------------------------------------------------------------------------
    @property
    def transformers_model(self) -> nn.Module:
        """The ``transformers`` model (inside the PEFT wrapper if there is one)."""
        return self.pretrained_model.get_base_model() if self.is_peft_model else self.pretrained_model

    @property
    def device(self) -> torch.device:
        return self.transformers_model.device

    def prepare_inputs_for_generation(self, *args, **kwargs) -> dict:
        """The wrapped model's ``prepare_inputs_for_generation``."""
        return self.pretrained_model.prepare_inputs_for_generation(*args, **kwargs)

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        """The wrapped model's ``gradient_checkpointing_enable``."""
        self.transformers_model.gradient_checkpointing_enable(**kwargs)

    def gradient_checkpointing_disable(self) -> None:
        """The wrapped model's ``gradient_checkpointing_disable``."""
        self.transformers_model.gradient_checkpointing_disable()

    def enable_input_require_grads(self) -> None:
        """The wrapped model's ``enable_input_require_grads`` (for gradient checkpointing with frozen embeddings)."""
        self.transformers_model.enable_input_require_grads()

    def generate(self, *args, **kwargs):
        """Delegates to the wrapped model's ``generate``."""
        return self.pretrained_model.generate(*args, **kwargs)

    def _has_lm_head(self) -> bool:
        return any(hasattr(self.pretrained_model, name) for name in self.lm_head_namings) or (
            self.transformers_model.get_output_embeddings() is not None
        )

    def _head_device(self) -> torch.device:
        head = self.transformers_model.get_output_embeddings()
        parameter = next(head.parameters(), None) if head is not None else None
        return parameter.device if parameter is not None else next(self.pretrained_model.parameters()).device

    def _init_weights(self, **kwargs) -> None:
        """Initialise the value head: ``v_head_init_strategy`` ``None`` keeps PyTorch's default (random) init,
        ``"normal"`` draws the weight from N(0, ``v_head_initializer_range``, default 0.2) and zeroes the bias."""
        initializer_range = kwargs.pop("v_head_initializer_range", 0.2)
        init_strategy = kwargs.pop("v_head_init_strategy", None)
        if init_strategy == "normal":
            self.v_head.summary.weight.data.normal_(mean=0.0, std=initializer_range)
            self.v_head.summary.bias.data.zero_()
        elif init_strategy is not None:
            raise ValueError(f"v_head_init_strategy must be None or 'normal', got {init_strategy!r}")

    # ---------------------------------------------------------------------------------------------------------
    def post_init(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load the value head from the ``v_head.*`` entries of ``state_dict`` (other keys are ignored) and, for a
        model dispatched over several devices (``hf_device_map``), move the wrapper's outputs to the device of
        the value head (that of the LM head)."""
        head_state = {key.split("v_head.", 1)[1]: value for key, value in state_dict.items() if is_value_head_key(key)}
        if head_state:
            self.v_head.load_state_dict(head_state, strict=False)
        device_map = getattr(self.transformers_model, "hf_device_map", None)
        devices = set(device_map.values()) if device_map else set()
        if "disk" in devices or ("cpu" in devices and len(devices) > 1):
            raise ValueError(
                "The model is offloaded on CPU or disk - CPU & disk offloading is not supported for ValueHead models."
            )
        if len(devices) > 1:
            self.register_forward_hook(_move_outputs_to_head_device)
            self.is_sequential_parallel = True

    def compute_reward_score(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> torch.Tensor:
        """Scores of the reward adapter: ``score(last hidden state)`` `[B, T, num_labels]`, without gradients.

        Switches to the reward adapter, runs the model in eval mode, then switches back to the policy adapter
        (``policy_adapter_name``, or ``ppo_adapter_name=...`` if given) and restores the training mode and every
        parameter's ``requires_grad``.

        Raises:
            ValueError: the model was loaded without ``reward_adapter``.
        """
        if not self.supports_rm_adapter:
            raise ValueError("This model does not support reward modeling adapter.")
        policy_adapter = kwargs.pop("ppo_adapter_name", None) or self.policy_adapter_name
        model = self.pretrained_model
        was_training = model.training
        requires_grad = [(param, param.requires_grad) for param in model.parameters()]
        model.set_adapter(self.rm_adapter_name)
        model.eval()
        try:
            with torch.no_grad():
                output = model(
                    input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, return_dict=True, **kwargs
                )
                hidden = (getattr(output, "decoder_hidden_states", None) or output.hidden_states)[-1]
                scores = self.score(hidden.to(self.score.weight.device))
        finally:
            model.set_adapter(policy_adapter)
            model.train(was_training)
            for param, flag in requires_grad:
                param.requires_grad_(flag)
        return scores

    # ---------------------------------------------------------------------------------------------------------
    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """Save in legacy TRL's layout, so legacy TRL and textenv read each other's checkpoints.

        A full model: the wrapped model's ``save_pretrained`` with ``state_dict=self.state_dict()``, i.e. its own
        weights plus ``v_head.*`` in ``model.safetensors`` (or shards with ``max_shard_size``); transformers'
        ``from_pretrained`` still loads the folder (it ignores the ``v_head.*`` keys). A PEFT model: the
        adapter through ``peft`` plus ``pytorch_model.bin`` holding only the ``v_head.*`` tensors.

        Args:
            save_directory: the folder.
            kwargs: passed to the wrapped model's ``save_pretrained`` (``max_shard_size``, ``state_dict``, ...).
        """
        state_dict = kwargs.pop("state_dict", None)
        os.makedirs(save_directory, exist_ok=True)
        if kwargs.get("is_main_process", True):
            stale = os.path.join(save_directory, OLD_VALUE_HEAD_FILE)
            if os.path.isfile(stale):
                os.remove(stale)  # an earlier textenv save into this folder; the head now lives in the weight files
        if self.is_peft_model:
            if state_dict is None:
                state_dict = {f"v_head.{k}": v.detach().cpu() for k, v in self.v_head.state_dict().items()}
            if kwargs.get("is_main_process", True):
                torch.save(state_dict, os.path.join(save_directory, BIN_WEIGHTS))
        else:
            # a fresh dict: transformers pops the tensors it writes
            kwargs["state_dict"] = dict(self.state_dict() if state_dict is None else state_dict)
        self.pretrained_model.save_pretrained(save_directory, *args, **kwargs)

    def push_to_hub(
        self,
        repo_id: str,
        commit_message: str = "Upload model with value head",
        private: bool | None = None,
        token: str | None = None,
        **kwargs,
    ) -> str:
        """Upload the [`save_pretrained`] folder (weights with the value head, config) to the Hugging Face Hub."""
        import tempfile

        from huggingface_hub import HfApi

        legacy_token = kwargs.pop("use_auth_token", None)
        token = token if token is not None else legacy_token
        api = HfApi(token=token if isinstance(token, str) else None)
        api.create_repo(repo_id, private=private, exist_ok=True)
        with tempfile.TemporaryDirectory() as folder:
            self.save_pretrained(folder, **kwargs)
            info = api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=commit_message)
        return str(info)

    # ---------------------------------------------------------------------------------------------------------
    @classmethod
    def _split_kwargs(cls, kwargs: dict) -> tuple[dict, dict, dict]:
        """``(value-head kwargs, from_pretrained kwargs, prepare_model_for_kbit_training kwargs)``."""
        try:
            from peft import prepare_model_for_kbit_training

            kbit_names = set(inspect.signature(prepare_model_for_kbit_training).parameters) - {"model"}
        except ImportError:
            kbit_names = set()
        supported, unsupported, kbit = {}, {}, {}
        for key, value in kwargs.items():
            target = supported if key in cls.supported_args else kbit if key in kbit_names else unsupported
            target[key] = value
        return supported, unsupported, kbit

    @classmethod
    def add_and_load_reward_modeling_adapter(
        cls, pretrained_model: nn.Module, adapter_model_id: str, adapter_name: str = "reward_model_adapter", token=None
    ) -> nn.Module:
        """Load a reward adapter into the PEFT model and return its frozen score head (see
        `textenv.ppo.reward_adapter`)."""
        return load_reward_adapter(pretrained_model, adapter_model_id, adapter_name, token=token)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs) -> "PreTrainedModelWrapper":
        """Load (or wrap) a model, add the value head and restore it when the checkpoint has one.

        Args:
            pretrained_model_name_or_path: a folder or Hub id (a full model, or a PEFT adapter folder with
                ``adapter_config.json``), or an already loaded model (``PreTrainedModel`` or ``PeftModel``).
            model_args: passed to ``from_pretrained`` of ``transformers_parent_class``.
            peft_config: a ``peft.PeftConfig``: wrap the model with a new adapter (ignored, with a warning, for
                an adapter folder or a model that is already a PeftModel).
            is_trainable: for an adapter folder, whether the loaded adapter is trainable (default ``False``, as
                legacy TRL: pass ``is_trainable=True`` to go on training a saved adapter).
            reward_adapter: folder or Hub id of a reward-modeling adapter to load next to the policy adapter
                (PEFT models only); ``reward_adapter_name`` (default ``"reward_adapter"``) names it.
            kwargs: value-head options (``supported_args``), ``prepare_model_for_kbit_training`` options, and
                ``from_pretrained`` options of the base model (``torch_dtype`` is passed on as ``dtype``).
        """
        peft_config = kwargs.pop("peft_config", None)
        reward_adapter = kwargs.pop("reward_adapter", None)
        reward_adapter_name = kwargs.pop("reward_adapter_name", "reward_adapter")
        is_trainable = kwargs.pop("is_trainable", False)
        head_kwargs, pretrained_kwargs, kbit_kwargs = cls._split_kwargs(kwargs)
        _rename_torch_dtype(pretrained_kwargs)
        token = pretrained_kwargs.get("token")
        if reward_adapter is not None and not isinstance(reward_adapter, (str, os.PathLike)):
            raise ValueError(
                "The `reward_adapter` argument should be a string representing the name of local path or the Hub id "
                "to the Reward Modeling adapter."
            )
        if peft_config is not None:
            from peft import PeftConfig

            if not isinstance(peft_config, PeftConfig):
                raise ValueError("The `peft_config` argument should be an instance of `peft.PeftConfig` class.")

        source = pretrained_model_name_or_path
        location = None
        if isinstance(source, (str, os.PathLike)):
            location = CheckpointLocation.from_kwargs(source, pretrained_kwargs)
            model = cls._load_model(location, model_args, pretrained_kwargs, peft_config, is_trainable, kbit_kwargs)
        elif isinstance(source, nn.Module):
            model = source
            if peft_config is not None and is_peft_model(model):
                warnings.warn("`peft_config` is ignored: the model is already a PeftModel", UserWarning, stacklevel=2)
            elif peft_config is not None:
                model = _add_adapter(model, peft_config, kbit_kwargs)
        else:
            raise ValueError(
                f"pretrained_model_name_or_path should be a string or a PreTrainedModel, but is {type(source)}"
            )

        if is_peft_model(model):
            from peft import PromptLearningConfig

            if isinstance(getattr(model, "active_peft_config", None), PromptLearningConfig):
                raise ValueError("PromptLearningConfig is not supported for PPO training.")
        adapter_args: dict[str, Any] = {"supports_rm_adapter": False}
        if reward_adapter is not None:
            if not is_peft_model(model):
                raise ValueError("reward_adapter can only be used with a PeftModel. ")
            score = cls.add_and_load_reward_modeling_adapter(
                model, str(reward_adapter), reward_adapter_name, token=token
            )
            adapter_args = {"score_module": score, "supports_rm_adapter": True, "rm_adapter_name": reward_adapter_name}

        wrapper = cls(model, **adapter_args, **head_kwargs)
        if location is not None:
            state = read_value_head_state(location)
            if not state:
                logger.info(
                    "No v_head weights in %s: a new value head (expected unless resuming PPO)", location.name_or_path
                )
        else:
            state = {key: value for key, value in source.state_dict().items() if is_value_head_key(key)}
        wrapper.post_init(state_dict=state)
        return wrapper

    @classmethod
    def _load_model(cls, location, model_args, pretrained_kwargs, peft_config, is_trainable, kbit_kwargs) -> nn.Module:
        adapter_config = location.find("adapter_config.json")
        if adapter_config is None:
            model = cls.transformers_parent_class.from_pretrained(
                location.name_or_path, *model_args, **pretrained_kwargs
            )
            return _add_adapter(model, peft_config, kbit_kwargs) if peft_config is not None else model
        from peft import PeftConfig, PeftModel

        if peft_config is not None:
            logger.warning(
                "`peft_config` argument ignored since a peft config file was found in %s", location.name_or_path
            )
        trained_config = PeftConfig.from_pretrained(os.path.dirname(adapter_config))
        base = cls.transformers_parent_class.from_pretrained(
            trained_config.base_model_name_or_path, *model_args, **pretrained_kwargs
        )
        adapter_kwargs = {"subfolder": location.subfolder} if location.subfolder else {}
        return PeftModel.from_pretrained(
            base, location.name_or_path, is_trainable=is_trainable, token=location.token, **adapter_kwargs
        )


def _add_adapter(model: nn.Module, peft_config, kbit_kwargs: dict) -> nn.Module:
    from peft import get_peft_model, prepare_model_for_kbit_training

    if getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False):
        model = prepare_model_for_kbit_training(model, **kbit_kwargs)
    return get_peft_model(model, peft_config)


def _rename_torch_dtype(kwargs: dict) -> None:
    """transformers 5 calls ``torch_dtype`` ``dtype``; legacy callers pass ``torch_dtype``."""
    if "torch_dtype" in kwargs:
        torch_dtype = kwargs.pop("torch_dtype")
        kwargs.setdefault("dtype", torch_dtype)


def _move_outputs_to_head_device(module: nn.Module, inputs, outputs):
    device = module.v_head.summary.weight.device
    return tuple(output.to(device) if isinstance(output, torch.Tensor) else output for output in outputs)
