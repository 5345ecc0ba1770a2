"""The `textenv view` page in headless Chromium (driven by Playwright, with the system's Chromium: nothing is
downloaded), built from the real runs of `test_view.py`: the filters list as many episodes as Python counts
in the JSONL files, a clicked episode shows its recorded segments in `show_text`'s colours and its exact
token ids, the curves have one point per step, and the page makes no request and raises no script error.
Skipped only where Chromium cannot start."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from test_view import build_runs, expected_episodes
from textenv.gym import read_completions
from textenv.view import build_page, show
from textenv.view.page import segment_colours


def rgb(hex_colour: str) -> str:
    """``#00afff`` -> ``rgb(0, 175, 255)``, as `getComputedStyle` reports it."""
    return "rgb({}, {}, {})".format(*(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)))


def chromium_executable() -> str | None:
    candidates = [os.environ.get("TEXTENV_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"]
    return next((shutil.which(name) for name in candidates if name and shutil.which(name)), None)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        pytest.skip(f"chromium cannot start: playwright is not installed ({error}); pip install -e '.[dev]'")
    executable = chromium_executable()
    if executable is None:
        pytest.skip("chromium cannot start: no chromium on PATH (apt-get install chromium, or set TEXTENV_CHROMIUM)")
    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"] if os.geteuid() == 0 else [])
    except Exception as error:  # noqa: BLE001 - any launch failure means no browser here
        playwright.stop()
        pytest.skip(f"chromium cannot start: {error}")
    yield browser
    browser.close()
    playwright.stop()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return build_runs(tmp_path_factory.getbasetemp() / "view_runs")


@pytest.fixture()
def open_page(browser, tmp_path):
    """``open_page(run_path)``: the page of a run in a fresh tab; afterwards, no script error and no request
    other than the page's own file."""
    opened = []

    def open_(path, name="page.html"):
        output = tmp_path / name
        build_page(path, output)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors, requests = [], []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("request", lambda request: requests.append(request.url))
        page.goto(output.as_uri())
        opened.append((page, errors, requests, output.as_uri()))
        return page

    yield open_
    for page, errors, requests, url in opened:
        assert errors == []
        assert set(requests) == {url}
        page.close()


def shown(page) -> int:
    rows = page.locator("#episode-rows tr").count()
    assert page.inner_text("#shown-count") == str(rows)
    return rows


def test_filters_list_as_many_episodes_as_python_counts(open_page, runs):
    records = expected_episodes(runs["text"])
    page = open_page(runs["text"])
    total = len(records)
    assert shown(page) == total == int(page.inner_text("#total-count")) == 15  # 2 steps x 6, 3 evaluation episodes
    names = lambda r: [call["name"] for call in r["tool_calls"]]  # noqa: E731
    tool_error = lambda r: any(call["error"] for call in r["tool_calls"])  # noqa: E731
    cases = [
        ({"#filter-step": "1"}, {}, lambda r: r["step"] == 1),
        ({"#filter-phase": "eval-after"}, {}, lambda r: r["phase"] == "eval-after"),
        ({}, {"#filter-reward-min": "1"}, lambda r: r["reward"] >= 1),
        ({}, {"#filter-reward-max": "0"}, lambda r: r["reward"] <= 0),
        ({"#filter-tool": "Calculator"}, {}, lambda r: "Calculator" in names(r)),
        ({"#filter-tool": "Search"}, {}, lambda r: "Search" in names(r)),
        ({"#filter-tool": "(no tool call)"}, {}, lambda r: not names(r)),
        ({"#filter-finish": "truncated"}, {}, lambda r: r["finish_reason"] == "truncated"),
        ({"#filter-finish": "submit"}, {}, lambda r: r["finish_reason"] == "submit"),
        ({"#filter-error": "has"}, {}, lambda r: bool(r["error"]) or tool_error(r)),
        ({"#filter-error": "tool"}, {}, tool_error),
        ({"#filter-error": "none"}, {}, lambda r: not r["error"] and not tool_error(r)),
        ({"#filter-step": "0", "#filter-tool": "Calculator", "#filter-error": "none"}, {"#filter-reward-min": "1"},
         lambda r: r["step"] == 0 and "Calculator" in names(r) and not tool_error(r) and r["reward"] >= 1),
        ({}, {"#filter-text": "<request><Search>"}, lambda r: any("<request><Search>" in s["text"] for s in r["segments"])),
    ]
    for selects, inputs, keep in cases:
        for selector, value in selects.items():
            page.select_option(selector, value)
        for selector, value in inputs.items():
            page.fill(selector, value)
        expected = sum(1 for record in records if keep(record))
        assert 0 < expected < total, (selects, inputs)  # every filter really filters
        assert shown(page) == expected, (selects, inputs)
        listed = [int(row) for row in page.eval_on_selector_all("#episode-rows tr", "rows => rows.map(r => r.dataset.id)")]
        assert listed == [i for i, record in enumerate(records) if keep(record)]
        page.click("#filter-reset")
        assert shown(page) == total


def test_a_clicked_episode_shows_its_segments_in_show_text_colours_and_its_token_ids(open_page, runs):
    records = expected_episodes(runs["text"])
    index = next(i for i, r in enumerate(records) if r["step"] == 1 and r["reward"] == 1 and [c["name"] for c in r["tool_calls"]] == ["Calculator"])
    record, colours = records[index], segment_colours()
    page = open_page(runs["text"])
    page.click(f'#episode-rows tr[data-id="{index}"]')
    assert page.get_attribute("#episode-detail", "data-id") == str(index)
    assert page.locator("#episode-rows tr.selected").get_attribute("data-id") == str(index)

    segments = page.eval_on_selector_all(
        "#segments .segment", "spans => spans.map(s => [s.dataset.kind, s.textContent, getComputedStyle(s).backgroundColor, getComputedStyle(s).color])"
    )
    assert [(kind, text) for kind, text, _, _ in segments] == [(s["kind"], s["text"]) for s in record["segments"]]
    assert [s["kind"] for s in record["segments"]] == ["prompt", "model", "tool", "model"]
    for kind, _, background, colour in segments:
        assert background == rgb(colours[kind]["background"]) and colour == rgb(colours[kind]["color"])
    assert "<request><Calculator>" in segments[1][1]  # shown as text ...
    assert page.evaluate("document.querySelectorAll('#episode-detail request, #episode-detail call, #episode-detail submit').length") == 0  # ... not markup
    reward = page.locator("#segments .reward-line")
    assert reward.inner_text() == "Reward: 1"
    assert reward.evaluate("e => getComputedStyle(e).backgroundColor") == rgb(colours["reward"]["background"])

    calls = page.eval_on_selector_all("#tool-call-table tr.tool-call", "rows => rows.map(r => Array.from(r.cells).map(c => c.textContent))")
    call = record["tool_calls"][0]
    assert calls == [["Calculator", call["query"], call["response"], "no"]] and call["response"].lstrip("-").isdigit()

    tokens = page.eval_on_selector_all(
        "#tokens .token",
        "ts => ts.map(t => [Number(t.dataset.id), t.querySelector('.token-id').textContent, t.querySelector('.token-text').textContent, getComputedStyle(t).backgroundColor])",
    )
    ids, mask, prompt_length = record["tokens"]["ids"], record["tokens"]["mask"], record["tokens"]["prompt_length"]
    assert [t[0] for t in tokens] == ids and [t[1] for t in tokens] == [str(i) for i in ids]
    assert [t[2] for t in tokens] == record["tokens"]["text"] and len(ids) > prompt_length > 0
    kinds = ["prompt" if i < prompt_length else ("model" if m else "tool") for i, m in enumerate(mask)]
    assert [t[3] for t in tokens] == [rgb(colours[kind]["background"]) for kind in kinds]
    assert {"prompt", "model", "tool"} == set(kinds)


def test_the_curves_have_one_point_per_step(open_page, runs):
    steps = read_completions(runs["text"] / "steps.jsonl")
    page = open_page(runs["text"])
    for chart, key in [("reward", "reward_mean"), ("reward", "accuracy"), ("tools", "tool_calls"), ("tools", "tool_errors"), ("kl", "kl")]:
        points = page.eval_on_selector_all(f"#chart-{chart} circle.series-{key}", "cs => cs.map(c => [Number(c.dataset.step), Number(c.dataset.value)])")
        assert points == [[line["step"], pytest.approx(line[key])] for line in steps], key
    heights = page.eval_on_selector_all("#chart-tools circle.point", "cs => cs.map(c => [c.dataset.value, Number(c.getAttribute('cy'))])")
    by_value = {float(value): cy for value, cy in heights}
    assert by_value[5.0] < by_value[2.0]  # more calls are drawn higher
    page.click("#chart-reward circle.series-accuracy[data-step='1']")
    assert page.input_value("#filter-step") == "1"
    assert shown(page) == sum(1 for r in expected_episodes(runs["text"]) if r["step"] == 1)


def test_a_gym_run_shows_failed_episodes_without_tokens(open_page, runs):
    records = expected_episodes(runs["gym"])
    page = open_page(runs["gym"])
    assert shown(page) == len(records) == 6
    page.select_option("#filter-error", "episode")
    failed = [i for i, r in enumerate(records) if r.get("error")]
    assert shown(page) == len(failed) == 2
    page.click(f'#episode-rows tr[data-id="{failed[0]}"]')
    assert re.fullmatch(r"Error: reset: KeyError: .*query.*", page.inner_text("#episode-error"))
    assert page.locator("#no-tokens").is_visible() and page.locator("#tokens").count() == 0
    page.click("#filter-reset")
    index = next(i for i, r in enumerate(records) if r["reward"] == 1)
    page.click(f'#episode-rows tr[data-id="{index}"]')
    kinds = page.eval_on_selector_all("#segments .segment", "spans => spans.map(s => s.dataset.kind)")
    assert kinds == ["prompt", "prompt", "model", "tool", "model"]
    assert page.locator("#tokens .token").count() == len(records[index]["tokens"]["ids"])
    assert page.eval_on_selector_all("#tool-call-table tr.tool-call td", "cells => cells.map(c => c.textContent)") == ["Calculator", "2+3", "5", "no"]


def test_a_bare_completions_file(open_page, runs):
    lines = read_completions(runs["gym"] / "completions.jsonl")
    page = open_page(runs["gym"] / "completions.jsonl")
    assert shown(page) == len(lines)
    assert page.eval_on_selector_all("#episode-rows tr td:nth-child(3)", "cells => cells.map(c => c.textContent)") == ["rollout"] * len(lines)
    assert page.locator("#chart-reward circle.series-reward_mean").count() == len({line["step"] for line in lines}) == 2
    assert page.locator("#figure-kl").count() == 0  # completions.jsonl has no KL


def test_the_notebook_iframe_runs_the_page(browser, runs):
    page = browser.new_page()
    page.set_content(f"<html><body>{show(runs['text'], height=700)._repr_html_()}</body></html>")
    frame = page.frames[1]
    frame.wait_for_selector("#episode-rows tr")
    assert frame.locator("#episode-rows tr").count() == len(expected_episodes(runs["text"]))
    frame.click('#episode-rows tr[data-id="0"]')
    assert frame.locator("#segments .segment").count() == len(expected_episodes(runs["text"])[0]["segments"])
    page.close()


def test_an_episode_shows_the_policy_versions_of_its_turns(open_page, runs, tmp_path):
    import json

    lines = (runs["text"] / "episodes.jsonl").read_text().splitlines()
    record = {**json.loads(lines[0]), "policy_versions": [3, 4]}  # a turn of version 3, then one after the update to 4
    run = tmp_path / "versions"
    run.mkdir()
    (run / "episodes.jsonl").write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    page = open_page(run)
    page.click('#episode-rows tr[data-id="0"]')
    assert page.inner_text("#episode-versions").strip() == "policy versions: 3, 4"
    page.click('#episode-rows tr[data-id="1"]')
    assert page.locator("#episode-versions").count() == 0
