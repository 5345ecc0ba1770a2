"""textenv on vLLM in the benchmarks (`run.py --engine vllm`): the server `run.py` starts for a run, and what
the textenv sides (`textenv_side.py` and `gym_side.py` with `--vllm-url`) do to decode on it.

`run.py` starts one server of the bundled model (`textenv.vllm.server.VLLMServer`, from vLLM's own venv
`.venv-vllm`, on a free port) before the workloads and stops it at the end, also on an error, Ctrl-C or
SIGTERM; its start-up time is reported apart from the figures. Every side process builds its own
`VLLMEngine` on it, sends the weights and checks the served model at its first use (the first weight
sync, also reported apart) and makes one short warm-up request before timing. Every timed run starts with
the server's prefix cache dropped, as the in-process engine starts every run with a fresh cache.

The gym workload also runs a plain client loop on the same server (`gym_side.py --mode client-loop`: what a
user writes without textenv, `/v1/chat/completions` from a thread pool), with the same warm-up and an emptied
prefix cache before its timed run; `client_loop_table` puts textenv on vLLM beside it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import workload
from report import VLLM_SUFFIX

CLIENT_LOOP = "client-loop"  # the gym mode of the plain client loop (no textenv) on the server
DTYPES = ("float32", "bfloat16", "auto")  # resolved for this machine (textenv.hardware.resolve_server_dtype)
KV_CACHE_GIB = 1


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def running_server(dtype: str = "float32", log: Callable[[str], None] = _log, kv_cache_gib: float = KV_CACHE_GIB,
                   extra_args: Sequence[str] = ()) -> Iterator[Any]:
    """A vLLM server of the bundled model in `dtype` (resolved for this machine: `auto` is float32 on a CPU that
    emulates bf16) on a free port, stopped when the block ends however it ends (SIGTERM is turned into
    `SystemExit` meanwhile so that it ends the block too; the server's guard stops it if this process dies).
    The server's `dtype_choice` says which dtype it runs in and why; `extra_args` go to `vllm serve`."""
    from textenv.hardware import resolve_server_dtype
    from textenv.models import bundled_model_path
    from textenv.vllm.server import VLLMServer, free_port

    choice = resolve_server_dtype(dtype)
    server = VLLMServer(str(bundled_model_path()), free_port(), choice.dtype, kv_cache_gib=kv_cache_gib, extra_args=extra_args)
    server.dtype_choice = choice
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    log(f"[vllm] starting a server on {server.url}, {choice.reason} (log: {server.log_path}) ...")
    try:
        server.start()
        log(f"[vllm] server ready after {server.startup_seconds:.0f} s (not in the figures)")
        yield server
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)
        log(f"[vllm] server on {server.url} stopped")


def server_record(server: Any, dtype: str) -> dict[str, Any]:
    """What the report says about the server (its dtype and why, the CPU, start-up time and vLLM version) and
    how the sides reach it (URL, process group)."""
    from textenv.hardware import describe_cpu
    from textenv.vllm.client import VLLMServerClient

    version = (VLLMServerClient(server.url).request("GET", "/version") or {}).get("version")
    choice = getattr(server, "dtype_choice", None)
    return {"dtype": choice.dtype if choice else dtype, "requested_dtype": dtype, "dtype_reason": choice.reason if choice else None,
            "cpu": describe_cpu(), "startup_seconds": server.startup_seconds, "url": server.url, "pid": server.process.pid,
            "version": f"vLLM {version}" if version else "vLLM"}


# ------------------------------------------------------------------------------ the side processes
@contextmanager
def prepared_engine(url: str, model: Any, tokenizer: Any) -> Iterator[Any]:
    """A `VLLMEngine` on the server at `url`, ready to time: the weights sent and the served model checked
    (its first use), then one short greedy request (warm-up). Closed when the block ends (its weights
    folder, about 0.5 GiB under /dev/shm, is removed)."""
    from textenv.engine.backends import build_engine

    engine = build_engine("vllm", model, tokenizer, batch_size=32, vllm_server_url=url)
    try:
        started = time.perf_counter()
        engine.prepare()
        engine.prepare_seconds = time.perf_counter() - started
        ids = tokenizer("What is 1+1?", return_tensors="pt").input_ids[0]
        engine.generate_batch([ids], generation_kwargs={"max_new_tokens": 2, "do_sample": False})
        yield engine
    finally:
        engine.close()


def fresh_cache(engine: Any) -> None:
    """Drop the servers' prefix caches: a timed run starts cold, like a new in-process engine."""
    for client in engine.clients:
        client.reset_prefix_cache()


def engine_record(engine: Any) -> dict[str, Any]:
    """The one-time costs of a side process's engine, kept apart from the figures: the weight syncs' seconds
    and the whole first use (sync and the served model's checks)."""
    return {"sync_seconds": list(engine.sync_seconds), "prepare_seconds": engine.prepare_seconds}


def server_usage(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) and resident MiB of a server started in its own session (`VLLMServer`):
    every process of its process group (the API server, the engine core, the workers)."""
    ticks, pages = 0, 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[2]) == pid:  # fields[n - 3] is field n of proc(5): pgrp 5, utime 14, stime 15, rss 24
            ticks += int(fields[11]) + int(fields[12])
            pages += int(fields[21])
    return ticks / os.sysconf("SC_CLK_TCK"), pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def timed_run_on_server(env: Any, engine: Any, inputs: dict, server_pid: int | None) -> dict[str, Any]:
    """`workload.timed_run` of `env` (decoding with `engine`) on a fresh server cache; with `server_pid`, the server's CPU time over the run is
    added to `seconds_cpu` (and kept as `server_seconds_cpu`) and its resident memory after the run is kept
    as `server_rss_mb` (the table's peak RSS is this process's only)."""
    fresh_cache(engine)
    before = server_usage(server_pid)[0] if server_pid else 0.0
    record = workload.timed_run(env, inputs, time_turns=False)
    if server_pid:
        cpu, rss = server_usage(server_pid)
        record.update(server_seconds_cpu=cpu - before, server_rss_mb=rss)
        record["seconds_cpu"] += record["server_seconds_cpu"]
    return record


# ------------------------------------------------------------------------------ textenv against a plain client loop
_FRONT_ENDS = {"scheduler" + VLLM_SUFFIX: "textenv GymScheduler on vLLM", "text-env" + VLLM_SUFFIX: "textenv TextEnvironment on vLLM"}


def client_loop_table(results: dict, episodes: int, turns: int) -> str:
    """The gym workload's textenv sides on vLLM beside the plain client loop on the same server: median wall
    time (and the runs' spread), tokens/s, the ratio to the client loop (above 1: textenv is slower), the
    client process's and the server's CPU seconds over the timed run, and the episodes whose every reply has
    the same token ids as the client loop's."""
    import statistics

    loop = results[CLIENT_LOOP]
    runs = len(loop)
    loop_seconds = statistics.median(run["seconds"] for run in loop)
    header = ["side", "wall s (median)", "runs, s", "generated tokens", "tok/s", "/ client loop (wall)", "client CPU s", "server CPU s",
              "episodes token-identical to the client loop"]
    rows = []
    for mode, label in ((CLIENT_LOOP, "plain client loop (`/v1/chat/completions`, a thread per episode)"), *_FRONT_ENDS.items()):
        if mode not in results:
            continue
        side = results[mode]
        seconds = statistics.median(run["seconds"] for run in side)
        rows.append([
            label, f"{seconds:.1f}", ", ".join(f"{run['seconds']:.1f}" for run in side), str(side[0]["generated_tokens"]),
            f"{statistics.median(run['tokens_per_second'] for run in side):.1f}",
            "1" if mode == CLIENT_LOOP else f"**{seconds / loop_seconds:.3f}**",
            _median_of(side, "client_seconds_cpu"), _median_of(side, "server_seconds_cpu"),
            "-" if mode == CLIENT_LOOP else equal_episodes(side, loop),
        ])
    lines = [f"Gym ({episodes} episodes x {turns} turns, `{results.get('script', 'chat')}` env, {results.get('max_new_tokens', 32)} new tokens per turn, "
             f"greedy) on one vLLM server: textenv against a plain client loop, {runs} alternated run(s) per side, each on an emptied prefix cache.", "",
             "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def equal_episodes(results: list[dict], reference: list[dict]) -> str:
    """`"equal/episodes"`: episodes of the first runs whose every reply has the same token ids."""
    pairs = list(zip(results[0]["replies"], reference[0]["replies"]))
    return f"{sum(a == b for a, b in pairs)}/{len(pairs)}"


def _median_of(runs: list[dict], key: str) -> str:
    import statistics

    values = [run[key] for run in runs if key in run]
    return f"{statistics.median(values):.1f}" if values else "n/a"
