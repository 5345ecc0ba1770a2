"""Real smolagents tools are called through ``Tool.__call__`` (``setup()`` on first use, agent-type input and
output conversion with ``sanitize_inputs_outputs=True``, as smolagents' agents call them) on both the tag
path (`call_tool`) and the JSON path (`call_tool_with_arguments`); duck-typed ``name`` + ``forward``
objects keep going through ``forward``."""

from __future__ import annotations

import pytest

smolagents = pytest.importorskip("smolagents", reason="smolagents is an optional extra (pip install smolagents)")

from smolagents.default_tools import PythonInterpreterTool  # noqa: E402

from textenv.tools.base import TOOL_ERROR_PREFIX, call_tool, call_tool_with_arguments, tools_by_name  # noqa: E402


class TranslateTool(smolagents.Tool):
    """Needs `setup()`: its table exists only once setup has run, so calling `forward` directly fails."""

    name = "translate"
    description = "Translate an English word to French."
    inputs = {"word": {"type": "string", "description": "an English word"}}
    output_type = "string"

    def __init__(self) -> None:
        super().__init__()
        self.setup_calls = 0
        self.sanitize_flags: list[bool] = []

    def setup(self) -> None:
        self.setup_calls += 1
        self.table = {"cat": "chat", "dog": "chien"}
        self.is_initialized = True

    def __call__(self, *args, sanitize_inputs_outputs: bool = False, **kwargs):
        self.sanitize_flags.append(sanitize_inputs_outputs)
        return super().__call__(*args, sanitize_inputs_outputs=sanitize_inputs_outputs, **kwargs)

    def forward(self, word: str) -> str:
        return self.table[word]


class PairTool(smolagents.Tool):
    name = "pair"
    description = "Join two words."
    inputs = {
        "left": {"type": "string", "description": "first word"},
        "right": {"type": "string", "description": "second word"},
    }
    output_type = "string"

    def forward(self, left: str, right: str) -> str:
        return f"{left}+{right}"


class SearchTool(smolagents.Tool):
    """One required input and one optional (nullable) one, like smolagents' `GoogleSearchTool`."""

    name = "search"
    description = "Search."
    inputs = {
        "query": {"type": "string", "description": "what to look for"},
        "year": {"type": "integer", "description": "only this year", "nullable": True},
    }
    output_type = "string"

    def forward(self, query: str, year: int | None = None) -> str:
        return f"{query} in {year}"


class ClockTool(smolagents.Tool):
    name = "clock"
    description = "Tell the time."
    inputs = {}
    output_type = "string"

    def forward(self) -> str:
        return "noon"


class FrameworkBase:
    def __call__(self, query):
        return "through __call__"


class DuckTool(FrameworkBase):
    """Legacy TRL style: `name` + `forward`, not a smolagents Tool; its `__call__` is inherited."""

    name = "duck"

    def forward(self, query):
        return f"forward got {query}"


def test_tag_path_runs_setup_once_through_tool_call():
    tool = TranslateTool()
    assert tool.setup_calls == 0
    assert call_tool(tool, "cat") == "chat"
    assert call_tool(tool, "dog", timeout=5) == "chien"  # the timeout path calls from a worker thread
    assert tool.setup_calls == 1
    assert tool.sanitize_flags == [True, True]


def test_json_path_runs_setup_once_with_keyword_arguments():
    tool = TranslateTool()
    assert call_tool_with_arguments(tool, {"word": "dog"}) == "chien"
    assert call_tool_with_arguments(tool, {"word": "cat"}, timeout=5) == "chat"
    assert tool.setup_calls == 1
    assert tool.sanitize_flags == [True, True]
    missing = call_tool_with_arguments(tool, {"word": "bird"})
    assert missing.startswith(TOOL_ERROR_PREFIX) and "bird" in missing


def test_setup_is_needed_so_forward_alone_would_fail():
    # guards the two tests above: without Tool.__call__ the table does not exist
    with pytest.raises(AttributeError):
        TranslateTool().forward("cat")


@pytest.mark.parametrize(
    "call",
    [
        lambda tool: call_tool(tool, "print('hi')\n6 * 7"),
        lambda tool: call_tool_with_arguments(tool, {"code": "print('hi')\n6 * 7"}),
    ],
    ids=["tag", "json"],
)
def test_smolagents_builtin_python_interpreter_tool(call):
    response = call(PythonInterpreterTool())
    assert response == "Stdout:\nhi\n\nOutput: 42"
    assert type(response) is str  # smolagents returns an AgentText; the model gets plain text


def test_builtin_tool_errors_become_tool_error_text():
    response = call_tool(PythonInterpreterTool(), "1 / 0")
    assert response.startswith(TOOL_ERROR_PREFIX) and "division by zero" in response


def test_tools_by_name_uses_the_smolagents_tool_name():
    translate, interpreter = TranslateTool(), PythonInterpreterTool()
    assert tools_by_name([translate, interpreter]) == {"translate": translate, "python_interpreter": interpreter}


def test_tag_path_with_several_inputs_asks_for_json_tool_calls():
    response = call_tool(PairTool(), "a b")
    assert response.startswith(TOOL_ERROR_PREFIX)
    assert "'pair' takes several inputs (left, right)" in response
    assert 'tool_format="json"' in response
    assert call_tool_with_arguments(PairTool(), {"left": "a", "right": "b"}) == "a+b"


def test_tag_path_fills_the_only_required_input():
    assert call_tool(SearchTool(), "bears") == "bears in None"
    assert call_tool_with_arguments(SearchTool(), {"query": "bears", "year": 1986}) == "bears in 1986"


def test_tag_path_calls_a_tool_without_inputs_without_arguments():
    assert call_tool(ClockTool(), "") == "noon"


def test_duck_typed_name_and_forward_still_goes_through_forward():
    duck = DuckTool()
    assert call_tool(duck, "quack") == "forward got quack"
    assert tools_by_name([duck]) == {"duck": duck}
