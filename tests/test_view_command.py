"""The `textenv view` command (`textenv view PATH --output page.html`, `--serve`) and the run directory that
`textenv train` writes for it, on the real runs of `test_view.py`."""

from __future__ import annotations

import threading
import urllib.request

import pytest

from test_view import build_runs, expected_episodes
from textenv.cli import run_command
from textenv.gym import read_completions
from textenv.view import build_page, load_run
from textenv.view.command import serve


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return build_runs(tmp_path_factory.getbasetemp() / "view_runs")


def test_textenv_view_writes_the_page(tmp_path, runs, capsys):
    out = tmp_path / "page.html"
    result = run_command(["view", str(runs["text"]), "--output", str(out)])
    assert result == {"output": str(out), "episodes": len(expected_episodes(runs["text"])), "steps": 2}
    assert out.read_text() == build_page(runs["text"], title=f"textenv view: {runs['text']}")
    assert run_command(["view", "--path", str(runs["gym"] / "completions.jsonl"), "--output", str(out)])["episodes"] == 6
    assert f"-> {out}" in capsys.readouterr().out


def test_textenv_view_default_output_and_errors(tmp_path, runs):
    copy = tmp_path / "run"
    copy.mkdir()
    (copy / "episodes.jsonl").write_bytes((runs["text"] / "episodes.jsonl").read_bytes())
    assert run_command(["view", str(copy)])["output"] == str(copy / "view.html") and (copy / "view.html").exists()
    with pytest.raises(ValueError, match="PATH is missing: give a run directory"):
        run_command(["view", "--output", str(tmp_path / "x.html")])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run_command(["view", str(tmp_path / "missing")])


def test_serve_gives_the_page(tmp_path, runs):
    out = tmp_path / "page.html"
    build_page(runs["text"], out)
    server = serve(out, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/", timeout=10) as response:
            assert response.url.endswith("/page.html") and response.read().decode() == out.read_text()
    finally:
        server.shutdown()
        server.server_close()


def test_textenv_train_writes_the_run_directory(tmp_path):
    tiny = ["--model_name_or_path", "tiny", "--steps", "4", "--batch_size", "2", "--mini_batch_size", "1", "--max_new_tokens", "3", "--no_progress"]
    result = run_command(["train", *tiny, "--output_dir", str(tmp_path)])
    steps = read_completions(tmp_path / "steps.jsonl")
    assert [line["step"] for line in steps] == [0, 1] and [line["reward_mean"] for line in steps] == result["reward_means"]
    assert len(read_completions(tmp_path / "episodes.jsonl")) == 4
    assert load_run(tmp_path).steps == steps
