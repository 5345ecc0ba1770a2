"""The engine tables of the gym workload: the naive loop on transformers' `generate_batch` (`transformers-cb`) and every
generation path that ran (`backends_table`: the generate loop, GymScheduler on textenv's engine, on transformers'
continuous batching and on vLLM)."""

from __future__ import annotations

from report import VLLM_SUFFIX, equal_episodes, markdown_table, median, path_label, ratio

TRANSFORMERS_CB = "transformers-cb"  # gym_side.py's naive loop on transformers' continuous batching
TRANSFORMERS_CB_HEADER = ["episodes x turns, env", "runs per side", "naive loop (generate) s", "transformers continuous batching s",
                          "GymScheduler s", "GymScheduler / continuous batching", "episodes with equal replies (batching / naive, Gym / batching)"]


def transformers_cb_table(results: dict, episodes: int, turns: int) -> str:
    """The naive per-turn loop with `generate` and with transformers' continuous batching (`generate_batch`), against
    GymScheduler on the same episodes: median seconds, textenv's speed-up on the batching loop, equal replies."""
    naive, batching, scheduler = (results[mode] for mode in ("naive", TRANSFORMERS_CB, "scheduler"))
    seconds = {mode: median([run["seconds"] for run in runs]) for mode, runs in (("naive", naive), ("cb", batching), ("gym", scheduler))}
    row = [f"{episodes} x {turns}, {results.get('script', 'chat')}", min(len(naive), len(batching), len(scheduler)),
           seconds["naive"], seconds["cb"], seconds["gym"], f"**{ratio(seconds['cb'], seconds['gym']):.2f}x**",
           f"{equal_episodes(batching, naive)}, {equal_episodes(scheduler, batching)}"]
    return markdown_table(TRANSFORMERS_CB_HEADER, [row])


TRANSFORMERS_BACKEND = "scheduler-transformers"  # GymScheduler on textenv's transformers backend (engine="transformers")
BACKEND_SIDES = {
    "naive": "per-turn `generate` loop (no textenv)",
    "scheduler": "GymScheduler, engine=\"textenv\"",
    TRANSFORMERS_BACKEND: "GymScheduler, engine=\"transformers\"",
    TRANSFORMERS_CB: "per-turn loop on transformers' `generate_batch` (no textenv)",
    "scheduler" + VLLM_SUFFIX: "GymScheduler, engine=\"vllm\" (vLLM's CPU server)",
}
BACKENDS_HEADER = ["side", "runs", "median s", "speed-up over the generate loop", "episodes with the generate loop's replies", "path"]


def backends_table(results: dict) -> str:
    """The Gym episodes on every generation path that ran, against the per-turn `generate` loop: median seconds,
    speed-up, and episodes whose replies have the loop's token ids."""
    naive = median([run["seconds"] for run in results["naive"]])
    rows = [[label, len(results[mode]), median([run["seconds"] for run in results[mode]]),
             f"{ratio(naive, median([run['seconds'] for run in results[mode]])):.2f}x", equal_episodes(results[mode], results["naive"]),
             path_label(results[mode])]
            for mode, label in BACKEND_SIDES.items() if mode in results]
    return markdown_table(BACKENDS_HEADER, rows)
