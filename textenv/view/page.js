"use strict";
// textenv view: curves, filters, the episode list and one episode's segments, tool calls and tokens.
// All text reaches the page through textContent, never as HTML.
(function () {
  const DATA = JSON.parse(document.getElementById("run-data").textContent);
  const EPISODES = DATA.episodes.map((record, id) => Object.assign({ id: id }, record));
  const MAX_ROWS = 2000;
  const SVG = "http://www.w3.org/2000/svg";
  const byId = (id) => document.getElementById(id);

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function fmt(value) {
    if (value === null || value === undefined) return "";
    return Number.isInteger(value) ? String(value) : Number(value).toFixed(3);
  }

  // ------------------------------------------------------------------------------------------ curves
  function lineChart(container, series, yMin, yMax) {
    const width = 460, height = 200, left = 40, right = 10, top = 24, bottom = 28;
    const steps = DATA.steps.map((line) => line.step);
    const xMin = Math.min(...steps), xMax = Math.max(...steps);
    const x = (step) => left + (xMax === xMin ? (width - left - right) / 2 : ((step - xMin) / (xMax - xMin)) * (width - left - right));
    const y = (value) => top + (yMax === yMin ? 0.5 : 1 - (value - yMin) / (yMax - yMin)) * (height - top - bottom);
    const chart = svg("svg", { width: width, height: height, viewBox: `0 0 ${width} ${height}` });
    chart.appendChild(svg("line", { class: "axis", x1: left, y1: height - bottom, x2: width - right, y2: height - bottom }));
    chart.appendChild(svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: height - bottom }));
    for (let i = 0; i <= 4; i++) {
      const value = yMin + ((yMax - yMin) * i) / 4;
      chart.appendChild(svg("text", { class: "tick", x: left - 4, y: y(value) + 3, "text-anchor": "end" }, String(Number(value.toPrecision(3)))));
    }
    const every = Math.max(1, Math.ceil(steps.length / 8));
    steps.forEach((step, i) => {
      if (i % every === 0 || i === steps.length - 1) chart.appendChild(svg("text", { class: "tick", x: x(step), y: height - bottom + 14, "text-anchor": "middle" }, step));
    });
    chart.appendChild(svg("text", { class: "tick", x: width - right, y: height - 2, "text-anchor": "end" }, "step"));
    series.forEach((item, position) => {
      const points = DATA.steps.filter((line) => line[item.key] !== null && line[item.key] !== undefined);
      const group = svg("g", { class: `series-group series-${item.key}` });
      group.appendChild(svg("polyline", { class: `series series-${item.key}`, points: points.map((line) => `${x(line.step)},${y(line[item.key])}`).join(" ") }));
      for (const line of points) {
        const circle = svg("circle", { class: `point series-${item.key}`, cx: x(line.step), cy: y(line[item.key]), r: 3.5, "data-step": line.step, "data-value": line[item.key] });
        circle.appendChild(svg("title", {}, `step ${line.step}: ${item.label} ${fmt(line[item.key])}`));
        circle.addEventListener("click", () => { byId("filter-step").value = String(line.step); update(); });
        group.appendChild(circle);
      }
      group.appendChild(svg("text", { class: `legend series-${item.key}`, x: left + 8 + position * 120, y: 14, stroke: "none" }, item.label));
      chart.appendChild(group);
    });
    container.appendChild(chart);
  }

  function drawCharts() {
    if (!DATA.steps.length) { byId("charts").appendChild(el("p", { class: "muted" }, "No training steps recorded.")); return; }
    const values = (key) => DATA.steps.map((line) => line[key]).filter((value) => value !== null && value !== undefined);
    const rewards = values("reward_mean").concat(values("accuracy"));
    lineChart(byId("chart-reward"), [{ key: "reward_mean", label: "mean reward" }, { key: "accuracy", label: "accuracy" }], Math.min(0, ...rewards), Math.max(1, ...rewards));
    const tools = values("tool_calls").concat(values("tool_errors"));
    lineChart(byId("chart-tools"), [{ key: "tool_calls", label: "tool calls" }, { key: "tool_errors", label: "tool errors" }], 0, Math.max(1, ...tools));
    const kl = values("kl");
    if (kl.length) lineChart(byId("chart-kl"), [{ key: "kl", label: "KL" }], Math.min(0, ...kl), Math.max(...kl, 0.001));
    else byId("figure-kl").remove();
  }

  function summaryTable(rows, key, label, title) {
    if (!rows.length) return;
    const table = el("table", { id: `${key}-table` });
    const head = el("tr");
    [label, "episodes", "mean reward", "accuracy", "tool calls", "tool errors"].forEach((name) => head.appendChild(el("th", {}, name)));
    table.appendChild(head);
    for (const summary of rows) {
      const row = el("tr");
      [summary[key], summary.episodes, fmt(summary.reward_mean), fmt(summary.accuracy), summary.tool_calls, summary.tool_errors].forEach((value) => row.appendChild(el("td", {}, value)));
      table.appendChild(row);
    }
    byId("phases").appendChild(el("h2", {}, title));
    byId("phases").appendChild(table);
  }

  function drawPhases() {
    summaryTable(DATA.phases, "phase", "phase", "Episodes by phase");
    summaryTable(DATA.kinds || [], "env_kind", "environment kind", "Episodes by environment kind");
  }

  // ------------------------------------------------------------------------------------------ filters
  const toolError = (episode) => (episode.tool_calls || []).some((call) => call.error);
  const finishOf = (episode) => (episode.finish_reason === null || episode.finish_reason === undefined ? "(unknown)" : String(episode.finish_reason));

  function fillSelect(id, values, anyLabel) {
    const select = byId(id);
    select.appendChild(el("option", { value: "" }, anyLabel));
    for (const value of values) select.appendChild(el("option", { value: String(value) }, String(value)));
  }

  function setUpFilters() {
    const unique = (values) => Array.from(new Set(values));
    fillSelect("filter-phase", unique(EPISODES.map((e) => e.phase)), "all");
    fillSelect("filter-step", unique(EPISODES.map((e) => e.step)).sort((a, b) => a - b), "all");
    fillSelect("filter-tool", ["(no tool call)"].concat(unique(EPISODES.flatMap((e) => (e.tool_calls || []).map((call) => call.name))).sort()), "any");
    fillSelect("filter-finish", unique(EPISODES.map(finishOf)).sort(), "any");
    const kinds = unique(EPISODES.map((e) => e.env_kind).filter((kind) => kind !== null && kind !== undefined)).sort();
    if (kinds.length > 1) fillSelect("filter-kind", kinds, "all");
    else byId("kind-filter").remove();  // one kind (or none): nothing to choose
    for (const id of ["filter-phase", "filter-step", "filter-kind", "filter-tool", "filter-finish", "filter-error"]) {
      if (byId(id)) byId(id).addEventListener("change", update);
    }
    for (const id of ["filter-reward-min", "filter-reward-max", "filter-text"]) byId(id).addEventListener("input", update);
    byId("filter-reset").addEventListener("click", () => {
      document.querySelectorAll("#filters select, #filters input").forEach((input) => { input.value = ""; });
      update();
    });
    byId("total-count").textContent = String(EPISODES.length);
  }

  function matches(episode, filters) {
    if (filters.phase && episode.phase !== filters.phase) return false;
    if (filters.step && String(episode.step) !== filters.step) return false;
    if (filters.kind && String(episode.env_kind) !== filters.kind) return false;
    if (filters.min !== "" && !(episode.reward >= Number(filters.min))) return false;
    if (filters.max !== "" && !(episode.reward <= Number(filters.max))) return false;
    const names = (episode.tool_calls || []).map((call) => call.name);
    if (filters.tool === "(no tool call)" && names.length) return false;
    if (filters.tool && filters.tool !== "(no tool call)" && !names.includes(filters.tool)) return false;
    if (filters.finish && finishOf(episode) !== filters.finish) return false;
    const episodeError = Boolean(episode.error), anyToolError = toolError(episode);
    if (filters.error === "has" && !(episodeError || anyToolError)) return false;
    if (filters.error === "episode" && !episodeError) return false;
    if (filters.error === "tool" && !anyToolError) return false;
    if (filters.error === "none" && (episodeError || anyToolError)) return false;
    if (filters.text && !episode.segments.some((segment) => segment.text.includes(filters.text))) return false;
    return true;
  }

  function currentFilters() {
    return {
      phase: byId("filter-phase").value, step: byId("filter-step").value, kind: byId("filter-kind") ? byId("filter-kind").value : "",
      min: byId("filter-reward-min").value,
      max: byId("filter-reward-max").value, tool: byId("filter-tool").value, finish: byId("filter-finish").value,
      error: byId("filter-error").value, text: byId("filter-text").value,
    };
  }

  // ------------------------------------------------------------------------------------------ the list
  function update() {
    const filters = currentFilters();
    const shown = EPISODES.filter((episode) => matches(episode, filters));
    byId("shown-count").textContent = String(shown.length);
    const body = byId("episode-rows");
    body.replaceChildren();
    for (const episode of shown.slice(0, MAX_ROWS)) {
      const row = el("tr", { class: "episode-row", "data-id": episode.id });
      const names = (episode.tool_calls || []).map((call) => call.name + (call.error ? " (error)" : ""));
      const error = episode.error || (toolError(episode) ? "tool error" : "");
      [episode.id, episode.step, episode.phase, fmt(episode.reward), names.join(", "), finishOf(episode), error].forEach((value, column) => {
        row.appendChild(el("td", column === 6 && error ? { class: "has-error" } : {}, value));
      });
      row.addEventListener("click", () => showEpisode(episode, row));
      body.appendChild(row);
    }
    byId("list-note").textContent = shown.length > MAX_ROWS ? `Listing the first ${MAX_ROWS} of ${shown.length}; narrow the filters to see the rest.` : "";
  }

  // ------------------------------------------------------------------------------------------ one episode
  function legend() {
    const line = el("p", { id: "legend" }, "Colour legend: ");
    [["prompt", "Prompt"], ["tool", "System (tool)"], ["model", "Model"], ["reward", "Reward"]].forEach(([kind, label]) => line.appendChild(el("span", { class: `legend-entry kind-${kind}` }, label)));
    return line;
  }

  function toolCallTable(calls) {
    const table = el("table", { id: "tool-call-table" });
    const head = el("tr");
    ["tool", "query / arguments", "response", "error"].forEach((name) => head.appendChild(el("th", {}, name)));
    table.appendChild(head);
    for (const call of calls) {
      const row = el("tr", { class: "tool-call" });
      const query = call.query !== undefined ? call.query : JSON.stringify(call.arguments);
      [call.name, query, call.response, call.error ? "yes" : "no"].forEach((value) => row.appendChild(el("td", {}, value)));
      table.appendChild(row);
    }
    return table;
  }

  function tokenView(tokens) {
    const view = el("div", { id: "tokens" });
    tokens.ids.forEach((id, index) => {
      const kind = index < tokens.prompt_length ? "prompt" : tokens.mask[index] ? "model" : "tool";
      const token = el("span", { class: `token kind-${kind}`, "data-id": id, "data-mask": tokens.mask[index] });
      token.appendChild(el("span", { class: "token-text" }, tokens.text && tokens.text.length ? tokens.text[index] : ""));
      token.appendChild(el("span", { class: "token-id" }, id));
      view.appendChild(token);
    });
    return view;
  }

  function showEpisode(episode, row) {
    document.querySelectorAll("#episode-rows tr.selected").forEach((other) => other.classList.remove("selected"));
    if (row) row.classList.add("selected");
    const detail = byId("episode-detail");
    detail.replaceChildren();
    detail.setAttribute("data-id", episode.id);
    detail.appendChild(el("h2", {}, `Episode ${episode.id}: step ${episode.step}, ${episode.phase}`));
    const facts = el("p", { id: "episode-facts" });
    facts.appendChild(el("span", { class: "kind-reward", id: "episode-reward" }, `Reward: ${fmt(episode.reward)}`));
    facts.appendChild(document.createTextNode(`  finish: ${finishOf(episode)}`));
    if (episode.trajectory_id) facts.appendChild(document.createTextNode(`  trajectory: ${episode.trajectory_id}`));
    if (episode.policy_versions && episode.policy_versions.length) {
      const versions = episode.policy_versions.map((version) => (version === null ? "?" : String(version))).join(", ");
      facts.appendChild(el("span", { id: "episode-versions" }, `  policy versions: ${versions}`));
    }
    detail.appendChild(facts);
    if (episode.error) detail.appendChild(el("p", { class: "has-error", id: "episode-error" }, `Error: ${episode.error}`));
    detail.appendChild(legend());
    const text = el("pre", { id: "segments" });
    episode.segments.forEach((segment) => text.appendChild(el("span", { class: `segment kind-${segment.kind}`, "data-kind": segment.kind }, segment.text)));
    text.appendChild(document.createTextNode("\n\n"));
    text.appendChild(el("span", { class: "reward-line kind-reward" }, `Reward: ${fmt(episode.reward)}`));
    detail.appendChild(text);
    detail.appendChild(el("h2", {}, `Tool calls (${(episode.tool_calls || []).length})`));
    if ((episode.tool_calls || []).length) detail.appendChild(toolCallTable(episode.tool_calls));
    detail.appendChild(el("h2", {}, "Tokens"));
    if (episode.tokens) detail.appendChild(tokenView(episode.tokens));
    else detail.appendChild(el("p", { class: "muted", id: "no-tokens" }, "No tokens recorded for this episode (completions.jsonl lines have none)."));
  }

  drawCharts();
  drawPhases();
  setUpFilters();
  update();
})();
