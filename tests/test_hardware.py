"""Dtype defaults that suit the CPU: the hardware facts, the server dtype chosen from them (float32 where bf16
is emulated), the warning (once) where bf16 is asked for anyway, and the commands that carry the choice."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from textenv import hardware
from textenv.hardware import CPUFacts, resolve_server_dtype

EMULATED = CPUFacts("AMD EPYC", "AVX2", ("avx2",), bf16_native=False)
NATIVE = CPUFacts("Intel Xeon", "AVX512", ("avx2", "avx512f", "avx512_bf16", "amx_bf16"), bf16_native=True)


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings_logged(monkeypatch):
    """The warnings textenv.hardware logs during the test (attached to its logger: `setup_logging` may have
    stopped textenv's records from reaching the root logger)."""
    monkeypatch.setattr(hardware, "_warned", set())
    records, logger = Records(), logging.getLogger(hardware.__name__)
    logger.addHandler(records)
    yield records.messages
    logger.removeHandler(records)


@pytest.fixture
def cpu(monkeypatch):
    """Make this process see a CPU with `facts` and no CUDA device (and no kernel level forced by
    `ATEN_CPU_CAPABILITY`, which `make test-matrix` sets and the descriptions would name)."""
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)

    def use(facts: CPUFacts) -> None:
        monkeypatch.setattr(hardware, "cpu_facts", lambda: facts)
        monkeypatch.setattr(hardware, "cuda_visible", lambda: False)

    return use


# ------------------------------------------------------------------------------ the facts
def test_the_description_names_the_cpu_its_kernels_and_bf16(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert EMULATED.describe() == "AMD EPYC (avx2), kernels AVX2, bf16 emulated"
    assert NATIVE.describe() == "Intel Xeon (avx2, avx512f, avx512_bf16, amx_bf16), kernels AVX512, bf16 native"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")  # torch then reports AVX512 on an AVX2-only CPU
    forced = CPUFacts("AMD EPYC", "AVX512", ("avx2",), bf16_native=False).describe()
    assert forced == "AMD EPYC (avx2), kernels AVX512 (forced: ATEN_CPU_CAPABILITY=avx512), bf16 emulated"


def test_this_machines_facts_agree_with_torch_and_the_cpu_flags():
    facts = hardware.cpu_facts()
    flags = hardware._cpuinfo_flags()
    assert facts.kernel_level == torch.backends.cpu.get_cpu_capability()
    assert facts.bf16_native == bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    assert set(facts.vector_flags) <= flags
    assert facts.describe().startswith(facts.name) and f"kernels {facts.kernel_level}" in facts.describe()


def test_without_torchs_probes_bf16_is_read_from_the_cpu_flags(monkeypatch, warnings_logged):
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    assert hardware._bf16_native({"avx2", "avx512f"}) is False
    assert hardware._bf16_native({"avx2", "avx512_bf16"}) is True
    assert hardware._bf16_native({"asimd", "bf16"}) is True  # aarch64's Features
    assert warnings_logged == []
    assert hardware._bf16_native(set()) is None
    assert hardware._bf16_native(set()) is None
    assert len(warnings_logged) == 1 and "treating bf16 as emulated" in warnings_logged[0]


# ------------------------------------------------------------------------------ the server dtype
@pytest.mark.parametrize("requested", ["auto", None])
def test_auto_is_float32_where_bf16_is_emulated(cpu, requested, warnings_logged):
    cpu(EMULATED)
    choice = resolve_server_dtype(requested)
    assert choice.dtype == "float32"
    assert "instead of auto" in choice.reason and "no native bf16" in choice.reason and "kernels AVX2" in choice.reason
    assert "2.9-3.8x" in choice.reason  # the measured cost
    assert warnings_logged == []


def test_auto_stays_where_bf16_is_native_and_on_a_gpu(cpu, monkeypatch, warnings_logged):
    cpu(NATIVE)
    choice = resolve_server_dtype("auto")
    assert choice.dtype == "auto" and "native bf16" in choice.reason and "bfloat16" in choice.reason
    cpu(EMULATED)
    monkeypatch.setattr(hardware, "cuda_visible", lambda: True)
    assert resolve_server_dtype("auto").dtype == "auto"
    assert warnings_logged == []


def test_an_explicit_dtype_is_kept_and_emulated_bf16_warned_about_once(cpu, warnings_logged):
    cpu(EMULATED)
    assert resolve_server_dtype("float32").dtype == "float32"
    assert warnings_logged == []
    assert [resolve_server_dtype("bfloat16").dtype for _ in range(3)] == ["bfloat16"] * 3
    assert len(warnings_logged) == 1
    assert "no native bf16 (AMD EPYC (avx2), kernels AVX2, bf16 emulated): a vLLM server in bfloat16 is slower" in warnings_logged[0]
    assert "2.9-3.8x" in warnings_logged[0]
    cpu(NATIVE)
    hardware._warned.clear()
    assert resolve_server_dtype("bfloat16").dtype == "bfloat16"
    assert len(warnings_logged) == 1


def test_serve_passes_the_resolved_dtype_and_logs_why(cpu, monkeypatch, tmp_path, capsys):
    from textenv.vllm import server

    cpu(EMULATED)
    started = []
    monkeypatch.setattr(server, "_serve", lambda vllm_server: started.append(vllm_server) or 0)
    assert server.main(["--model", str(tmp_path), "--port", "8123", "--vllm_python", sys.executable]) == 0
    command = started[0].command
    assert command[command.index("--dtype") + 1] == "float32"
    assert "--dtype float32 instead of auto: this CPU has no native bf16 (AMD EPYC (avx2), kernels AVX2" in capsys.readouterr().out
    server.main(["--model", str(tmp_path), "--vllm_python", sys.executable, "--dtype", "bfloat16"])
    command = started[1].command
    assert command[command.index("--dtype") + 1] == "bfloat16"


def test_shared_server_starts_in_the_resolved_dtype(cpu, monkeypatch, tmp_path, warnings_logged):
    from textenv.vllm import server

    cpu(EMULATED)
    monkeypatch.setattr(server, "_shared", {})
    monkeypatch.setattr(server, "find_vllm_python", lambda explicit=None: sys.executable)
    def start(self, timeout=None):  # no process: only the command is checked
        self.process, self.startup_seconds = SimpleNamespace(poll=lambda: None), 0.0
        return self

    monkeypatch.setattr(server.VLLMServer, "start", start)
    monkeypatch.setattr(server.atexit, "register", lambda function: None)
    started = server.shared_server(str(tmp_path))
    assert started.command[started.command.index("--dtype") + 1] == "float32"
    assert server.shared_server(str(tmp_path), "auto") is started  # the same server: same resolved dtype
    bf16 = server.shared_server(str(tmp_path), "bfloat16")
    assert bf16.command[bf16.command.index("--dtype") + 1] == "bfloat16"
    assert len(warnings_logged) == 1 and "bfloat16" in warnings_logged[0]


def test_colocated_vllm_gets_the_resolved_dtype(cpu, monkeypatch, tmp_path):
    from textenv.vllm import colocate

    cpu(EMULATED)
    made = []
    monkeypatch.setattr(colocate, "import_vllm", lambda: SimpleNamespace(LLM=lambda **kwargs: made.append(kwargs)))
    colocate.ColocatedVLLM(str(tmp_path), max_model_len=512)
    colocate.ColocatedVLLM(str(tmp_path), dtype="bfloat16")
    assert [kwargs["dtype"] for kwargs in made] == ["float32", "bfloat16"]
    assert made[0]["max_model_len"] == 512


def test_episode_arguments_default_to_the_policys_float32():
    """The server textenv starts for a training run decodes the float32 policy's own tokens by default, on every
    CPU; `--vllm_dtype auto` opts into vLLM's bf16 where the CPU has it natively."""
    from textenv.options import EpisodeArguments

    assert EpisodeArguments().vllm_dtype == "float32"
    assert EpisodeArguments(vllm_dtype="auto").vllm_dtype == "auto"


# ------------------------------------------------------------------------------ bf16 autocast in textenv's own loops
def test_bf16_autocast_decoding_warns_once_where_emulated(cpu, tokenizer, tiny_model, warnings_logged):
    from textenv.engine import GenerationEngine

    cpu(EMULATED)
    engine = GenerationEngine(tiny_model, tokenizer, {"max_new_tokens": 2, "do_sample": False}, mixed_precision="bf16")
    for _ in range(2):
        engine.generate_batch([torch.tensor([1, 2, 3])])
    assert len(warnings_logged) == 1 and "bf16 autocast decoding (mixed_precision='bf16') is slower" in warnings_logged[0]
    assert hardware.AUTOCAST_COST in warnings_logged[0]
    cpu(NATIVE)
    hardware._warned.clear()
    engine.generate_batch([torch.tensor([1, 2, 3])])
    assert len(warnings_logged) == 1


def test_a_bf16_training_step_warns_where_emulated(cpu, warnings_logged):
    from accelerate.state import AcceleratorState

    from textenv.ppo import PPOConfig
    from textenv.ppo.trainer_setup import make_accelerator

    cpu(EMULATED)
    AcceleratorState._reset_state(True)
    try:
        make_accelerator(PPOConfig(accelerator_kwargs={"mixed_precision": "bf16"}), 1)
    finally:
        AcceleratorState._reset_state(True)
    assert len(warnings_logged) == 1 and "training step under bf16 autocast" in warnings_logged[0]


def test_a_bf16_policy_on_an_emulating_cpu_is_warned_about(cpu, warnings_logged, tiny_model, tokenizer, tmp_path):
    from textenv.training.policy import load_policy

    tiny_model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    cpu(EMULATED)
    load_policy(str(tmp_path), value_head=False)
    load_policy(str(tmp_path), value_head=True, dtype="float32")
    assert warnings_logged == []
    load_policy(str(tmp_path), value_head=True, dtype="bfloat16")
    assert len(warnings_logged) == 1 and "bfloat16 weights" in warnings_logged[0]


def test_benchmark_results_record_the_cpu(capsys):
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import report
    import workload

    workload.emit({"seconds": 1.0})
    line = capsys.readouterr().out
    assert f'"cpu": "{hardware.describe_cpu()}"' in line
    assert report.cpu_line([{"cpu": "A"}, {"cpu": "A"}], [{"cpu": "B"}]) == "CPU: A; B."
    assert report.cpu_line([{}]) == "CPU: not recorded (results saved before the CPU was)."


def test_the_report_prints_the_cpu_above_its_tables(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)  # the expected lines name no forced level
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("recorded_vllm_run", Path(__file__).with_name("test_benchmark_vllm.py"))
    recorded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recorded)
    import run

    raw = recorded.recorded_run()
    for results in raw["rollout"].values():
        results[0]["cpu"] = EMULATED.describe()
    raw["vllm"] = {**raw["vllm"], "dtype_reason": "--dtype float32 as asked", "cpu": EMULATED.describe()}
    lines = run.render(raw, 1, argparse.Namespace(workloads=["rollout"], bf16=False, threads=2, quick=False, repeats=1)).splitlines()
    table = next(index for index, line in enumerate(lines) if line.startswith("| workload |"))
    assert lines[table - 2] == f"CPU: {EMULATED.describe()}."
    assert any("`--dtype float32`: --dtype float32 as asked; CPU: AMD EPYC (avx2), kernels AVX2, bf16 emulated)" in line for line in lines)
