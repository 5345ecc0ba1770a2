"""`textenv view`: watch a run in one self-contained HTML page.

- `record`: `RunRecorder`, with which training runs append `episodes.jsonl` and `steps.jsonl` as they go
  (`textenv.training.train(run_dir=...)`, `textenv train`), `step_summary` and `set_aside_previous_run`;
- `episodes`: `episode_record`, one episode (`TextHistory`, `GymEpisode`, a `completions.jsonl` line) as an
  `episodes.jsonl` record;
- `data`: `load_run`, reading a run directory or one `.jsonl` file;
- `page`: `build_page` / `render_page`, the HTML (from `page.html`, `page.css`, `page.js`); `notebook`:
  `show(path)` for Jupyter;
- `command`: the `textenv view PATH --output page.html` command.

May import: textenv.environment, textenv.gym (completions.jsonl; a cycle), textenv.logs, textenv.parsing (textenv view's parser and settings errors), textenv.tools
"""

from textenv.view.data import RunData, load_run
from textenv.view.episodes import episode_record
from textenv.view.notebook import RunView, show
from textenv.view.page import build_page, render_page
from textenv.view.record import SOLVED_REWARD, RunRecorder, set_aside_previous_run, step_summary

__all__ = ["SOLVED_REWARD", "RunData", "RunRecorder", "RunView", "build_page", "episode_record", "load_run", "render_page", "set_aside_previous_run", "show", "step_summary"]
