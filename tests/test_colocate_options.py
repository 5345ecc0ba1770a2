"""Colocated vLLM's options: sleep mode (`ColocatedVLLM(sleep_mode=True)`, `--vllm_enable_sleep_mode`), the
command line's settings and `$TEXTENV_VLLM_LLM_KWARGS`. Sleep mode: when vLLM is put to sleep and woken. vLLM's sleep mode needs a CUDA GPU, so without one a stand-in for `vllm.LLM` records the
calls textenv makes (the order is what this module tests: sleep after a run of episodes, the weights woken
before the load and the KV cache after it, no request served on dropped weights); on a CPU sleep mode is
refused before vLLM starts. On a GPU, `test_sleep_mode_on_a_gpu_releases_memory_and_keeps_greedy_replies` runs the
real engine (skipped here)."""

from __future__ import annotations

import types

import pytest
import torch

from textenv.options import EpisodeArguments
from textenv.vllm import VLLMEngine, colocate
from textenv.vllm.colocate import ColocatedVLLM

REPLY = [7, 8]


class StandInLLM:
    """Records `sleep`, `wake_up` and weight loads; its engine finishes each request at the next step."""

    def __init__(self, model, **kwargs):
        self.kwargs, self.calls, self.pending = kwargs, [], []
        self.llm_engine = types.SimpleNamespace(add_request=self._add, step=self._step, has_unfinished_requests=lambda: bool(self.pending))

    def sleep(self, level):
        self.calls.append(f"sleep {level}")

    def wake_up(self, tags=None):
        self.calls.append(f"wake_up {','.join(tags) if tags else 'all'}")

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def collective_rpc(self, method, timeout=None, kwargs=None):
        self.calls.append(method)
        return [None]

    def _add(self, request_id, prompt, params):
        self.calls.append("request")
        self.pending.append(request_id)

    def _step(self):
        finished, self.pending = self.pending, []
        completion = types.SimpleNamespace(token_ids=REPLY, logprobs=[{token: types.SimpleNamespace(logprob=-0.5)} for token in REPLY],
                                           finish_reason="length", stop_reason=None)
        return [types.SimpleNamespace(request_id=request_id, finished=True, outputs=[completion]) for request_id in finished]


@pytest.fixture
def stand_in_vllm(monkeypatch):
    """`import_vllm` gives the stand-in, and the machine has a GPU as far as sleep mode's check goes."""
    module = types.SimpleNamespace(LLM=StandInLLM, SamplingParams=lambda **kwargs: kwargs, TokensPrompt=lambda **kwargs: kwargs)
    monkeypatch.setattr(colocate, "import_vllm", lambda: module)
    monkeypatch.setattr(colocate, "_has_cuda", lambda: True)


def play_one_turn(engine: VLLMEngine, tiny_model) -> list[int]:
    async def episode():
        completion = await engine.generate(torch.tensor([1, 2, 3]), generation_kwargs={"max_new_tokens": 2, "do_sample": False})
        return completion.token_ids.tolist()

    return engine.run_hosted(episode())


@pytest.mark.parametrize("level", [1, 2])
def test_vllm_sleeps_after_each_run_and_wakes_weights_then_cache_for_the_next(stand_in_vllm, tiny_model, tokenizer, level):
    vllm = ColocatedVLLM("folder", sleep_mode=True, sleep_level=level)
    assert vllm.llm.kwargs["enable_sleep_mode"] is True
    engine = VLLMEngine(tiny_model, tokenizer, [vllm], check_model=False)
    assert play_one_turn(engine, tiny_model) == REPLY
    assert vllm.llm.calls == ["textenv_load_shared_weights", "reset_prefix_cache", "request", f"sleep {level}"]
    assert vllm.asleep and vllm.needs_weights == (level == 2)
    with torch.no_grad():  # a trainer step changes the weights: the next run loads them first
        next(tiny_model.parameters()).add_(1.0)
    vllm.llm.calls.clear()
    play_one_turn(engine, tiny_model)
    assert vllm.llm.calls == ["wake_up weights", "textenv_load_shared_weights", "wake_up kv_cache", "reset_prefix_cache", "request", f"sleep {level}"]
    engine.close()


def test_level_2_reloads_unchanged_weights_before_a_request(stand_in_vllm, tiny_model, tokenizer):
    """Level 2 drops vLLM's weights: a run with no trainer step between (an evaluation) still loads them."""
    vllm = ColocatedVLLM("folder", sleep_mode=True, sleep_level=2)
    engine = VLLMEngine(tiny_model, tokenizer, [vllm], check_model=False)
    play_one_turn(engine, tiny_model)
    vllm.llm.calls.clear()
    play_one_turn(engine, tiny_model)
    assert vllm.llm.calls == ["wake_up weights", "textenv_load_shared_weights", "wake_up kv_cache", "reset_prefix_cache", "request", "sleep 2"]
    engine.close()


def test_a_request_on_dropped_weights_is_refused_and_level_1_wakes_for_it(stand_in_vllm):
    dropped = ColocatedVLLM("folder", sleep_mode=True, sleep_level=2)
    assert dropped.sleep() and dropped.llm.calls == ["sleep 2"]
    with pytest.raises(RuntimeError, match="dropped by sleep level 2: load the weights"):
        dropped.complete([1, 2], {"max_tokens": 2})
    offloaded = ColocatedVLLM("folder", sleep_mode=True, sleep_level=1)
    offloaded.sleep()
    assert offloaded.complete([1, 2], {"max_tokens": 2}).token_ids == REPLY
    assert offloaded.llm.calls == ["sleep 1", "wake_up all", "request"]
    assert not offloaded.asleep


def test_without_sleep_mode_vllm_never_sleeps(stand_in_vllm, tiny_model, tokenizer):
    vllm = ColocatedVLLM("folder")
    assert "enable_sleep_mode" not in vllm.llm.kwargs and not vllm.sleep()
    engine = VLLMEngine(tiny_model, tokenizer, [vllm], check_model=False)
    play_one_turn(engine, tiny_model)
    assert vllm.llm.calls == ["textenv_load_shared_weights", "reset_prefix_cache", "request"]
    assert not engine.sleeps_between_runs
    engine.close()


def test_sleep_mode_is_refused_on_a_cpu_before_vllm_starts(monkeypatch):
    monkeypatch.setattr(colocate, "_has_cuda", lambda: False)
    monkeypatch.setattr(colocate, "import_vllm", lambda: pytest.fail("vLLM was imported before the check"))
    with pytest.raises(ValueError, match="sleep_mode=True needs a CUDA GPU"):
        ColocatedVLLM("folder", sleep_mode=True)
    with pytest.raises(ValueError, match="sleep_level must be 1"):
        ColocatedVLLM("folder", sleep_level=3)


def test_the_command_line_passes_sleep_mode_dtype_and_memory_share_to_colocated_vllm(tiny_model):
    options = EpisodeArguments(engine="vllm", vllm_mode="colocate", vllm_enable_sleep_mode=True, vllm_gpu_memory_utilization=0.5,
                               vllm_dtype="bfloat16").engine_options(tiny_model)
    assert options["vllm_kwargs"] == {"llm_kwargs": {"sleep_mode": True, "dtype": "bfloat16", "gpu_memory_utilization": 0.5}}
    assert EpisodeArguments(engine="vllm", vllm_mode="colocate").engine_options(tiny_model)["vllm_kwargs"] == {
        "llm_kwargs": {"sleep_mode": False, "dtype": "float32"}}
    for flags in ({"vllm_enable_sleep_mode": True}, {"vllm_gpu_memory_utilization": 0.5}, {"engine": "vllm", "vllm_enable_sleep_mode": True}):
        with pytest.raises(ValueError, match="add --engine vllm --vllm_mode colocate"):
            EpisodeArguments(**flags)


def test_sleep_mode_with_rollouts_ahead_of_training_is_refused(stand_in_vllm, tiny_model, tokenizer):
    from textenv.training.overlap import EpisodePipeline

    engine = VLLMEngine(tiny_model, tokenizer, [ColocatedVLLM("folder", sleep_mode=True)], check_model=False)
    source = types.SimpleNamespace(scheduler=types.SimpleNamespace(policy=None, engine=engine))  # a Gym source's front end
    with pytest.raises(ValueError, match="max_staleness=1 plays episodes while the trainer steps"):
        EpisodePipeline(source, steps=2, max_staleness=1)
    engine.close()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM's sleep mode needs a CUDA GPU")
def test_sleep_mode_on_a_gpu_releases_memory_and_keeps_greedy_replies(bundled):
    model, tokenizer = bundled
    folder = model.config.name_or_path
    vllm = ColocatedVLLM(folder, sleep_mode=True, dtype="float32")
    prompt = tokenizer("The capital of France is", add_special_tokens=False).input_ids
    before = vllm.complete(prompt, {"max_tokens": 8, "temperature": 0.0}).token_ids
    free_awake = torch.cuda.mem_get_info()[0]
    assert vllm.sleep()
    assert torch.cuda.mem_get_info()[0] > free_awake, "sleeping released no GPU memory"
    assert vllm.complete(prompt, {"max_tokens": 8, "temperature": 0.0}).token_ids == before
    vllm.close()


def test_llm_kwargs_from_the_environment_are_defaults_that_arguments_override(stand_in_vllm, monkeypatch):
    monkeypatch.setenv("TEXTENV_VLLM_LLM_KWARGS", '{"enforce_eager": true, "max_model_len": 1024}')
    vllm = ColocatedVLLM("folder", max_model_len=2048)
    assert vllm.llm.kwargs["enforce_eager"] is True and vllm.llm.kwargs["max_model_len"] == 2048
    for text in ("enforce_eager", "[1]"):
        monkeypatch.setenv("TEXTENV_VLLM_LLM_KWARGS", text)
        with pytest.raises(ValueError, match=r"\$TEXTENV_VLLM_LLM_KWARGS must be a JSON object"):
            ColocatedVLLM("folder")
