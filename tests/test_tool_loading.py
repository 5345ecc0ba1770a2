import importlib.util
import json
import os
import sys

import huggingface_hub
import pytest
from huggingface_hub.errors import RepositoryNotFoundError

from textenv.tools import Calculator, PythonInterpreter, WikiSearch, load_tool, save_tool

USER_TOOL_SOURCE = '''
class Shout:
    """A user tool: upper-cases the query and appends a suffix."""

    def __init__(self, suffix="!"):
        self.suffix = suffix

    def __call__(self, query):
        return query.upper() + self.suffix


def reverse(query):
    return query[::-1]
'''

LEGACY_TOOL_SOURCE = '''
class SimpleCalculatorTool:
    name = "simple_calculator"

    def forward(self, text):
        return str(float(eval(text, {"__builtins__": {}})))
'''

MARKER_SOURCE = '''
import pathlib
pathlib.Path({marker!r}).write_text("the repository code ran")

class Evil:
    def __call__(self, query):
        return "evil"
'''


@pytest.fixture()
def user_module(tmp_path, monkeypatch):
    """A user's module file, imported as usual (registered in sys.modules)."""
    source = tmp_path / "src" / "shout_tool.py"
    source.parent.mkdir()
    source.write_text(USER_TOOL_SOURCE)
    spec = importlib.util.spec_from_file_location("shout_tool", source)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "shout_tool", module)
    spec.loader.exec_module(module)
    return module


def _write_config(folder, config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tool_config.json").write_text(json.dumps(config))
    return folder


# --- built-in tools -------------------------------------------------------------------------------


def test_calculator_round_trip_without_code(tmp_path):
    folder = save_tool(Calculator(legacy_format=True, max_length=64), tmp_path / "calc")
    config = json.loads((folder / "tool_config.json").read_text())
    assert config["tool_class"] == "textenv.tools.Calculator"
    assert "module" not in config
    assert not list(folder.glob("*.py"))
    loaded = load_tool(folder)
    assert isinstance(loaded, Calculator)
    assert (loaded.legacy_format, loaded.max_length) == (True, 64)
    assert loaded("13-3") == "10.0"


def test_python_interpreter_round_trip(tmp_path):
    folder = save_tool(PythonInterpreter(timeout=2, memory_mb=128), tmp_path / "python")
    loaded = load_tool(folder)
    assert isinstance(loaded, PythonInterpreter)
    assert (loaded.timeout, loaded.memory_mb) == (2, 128)
    assert loaded("print(6 * 7)") == "42\n"


def test_wiki_search_round_trip_keeps_its_documents(tmp_path):
    documents = [{"title": "Bears", "text": "The Chicago Bears won Super Bowl XX."}, "Zebras have stripes."]
    folder = save_tool(WikiSearch(documents, top_k=2, max_chars=300), tmp_path / "wiki")
    config = json.loads((folder / "tool_config.json").read_text())
    assert config["init_kwargs"]["documents"] == "documents.jsonl"
    assert config["file_kwargs"] == ["documents"]
    loaded = load_tool(folder)
    assert (loaded.top_k, loaded.max_chars) == (2, 300)
    assert loaded("Who won Super Bowl XX?") == "Bears\nThe Chicago Bears won Super Bowl XX."
    assert loaded("stripes") == "Zebras have stripes."


def test_load_kwargs_override_the_config(tmp_path):
    folder = save_tool(Calculator(), tmp_path / "calc")
    assert load_tool(folder, legacy_format=True)("2+2") == "4.0"


# --- user code and trust --------------------------------------------------------------------------


def test_user_class_is_copied_and_needs_trust(tmp_path, user_module):
    folder = save_tool(user_module.Shout(suffix="?!"), tmp_path / "shout")
    assert (folder / "shout_tool.py").read_text() == USER_TOOL_SOURCE
    config = json.loads((folder / "tool_config.json").read_text())
    assert config == {"tool_class": "Shout", "module": "shout_tool.py", "init_kwargs": {"suffix": "?!"}}
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        load_tool(folder)
    loaded = load_tool(folder, trust_remote_code=True)
    assert loaded("hey") == "HEY?!"
    resaved = save_tool(loaded, tmp_path / "resaved")  # a loaded tool can be saved again
    assert (resaved / "shout_tool.py").read_text() == USER_TOOL_SOURCE


def test_user_function_round_trip(tmp_path, user_module):
    folder = save_tool(user_module.reverse, tmp_path / "reverse")
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_tool(folder)
    assert load_tool(folder, trust_remote_code=True)("abc") == "cba"


def test_classes_without_a_source_file_cannot_be_saved(tmp_path):
    class Local:
        def __call__(self, query):
            return query

    with pytest.raises(ValueError, match="top-level"):
        save_tool(Local(), tmp_path / "local")


def test_untrusted_repository_code_never_runs(tmp_path):
    marker = tmp_path / "ran.txt"
    folder = _write_config(tmp_path / "evil", {"tool_class": "Evil", "module": "evil.py"})
    (folder / "evil.py").write_text(MARKER_SOURCE.format(marker=str(marker)))
    with pytest.raises(ValueError, match="evil.py"):
        load_tool(folder)
    assert not marker.exists()
    assert load_tool(folder, trust_remote_code=True)("x") == "evil"
    assert marker.exists()


def test_legacy_transformers_layout(tmp_path):
    folder = _write_config(
        tmp_path / "simple-calculator",
        {"tool_class": "tool.SimpleCalculatorTool", "name": "simple_calculator", "description": "A calculator."},
    )
    (folder / "tool.py").write_text(LEGACY_TOOL_SOURCE)
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_tool(folder)
    assert load_tool(folder, trust_remote_code=True).forward("13-3") == "10.0"


def test_folder_with_only_tool_py(tmp_path):
    folder = tmp_path / "bare"
    folder.mkdir()
    (folder / "tool.py").write_text(LEGACY_TOOL_SOURCE)
    assert type(load_tool(folder, trust_remote_code=True)).__name__ == "SimpleCalculatorTool"


# --- paths that escape the repository -------------------------------------------------------------


@pytest.mark.parametrize("module", ["../outside.py", "sub/../../outside.py"])
def test_module_path_with_dotdot_is_refused_even_when_trusted(tmp_path, module):
    marker = tmp_path / "ran.txt"
    (tmp_path / "outside.py").write_text(MARKER_SOURCE.format(marker=str(marker)))
    folder = _write_config(tmp_path / "repo", {"tool_class": "Evil", "module": module})
    with pytest.raises(ValueError, match="outside the tool repository"):
        load_tool(folder, trust_remote_code=True)
    assert not marker.exists()


def test_absolute_module_path_is_refused(tmp_path):
    marker = tmp_path / "ran.txt"
    outside = tmp_path / "outside.py"
    outside.write_text(MARKER_SOURCE.format(marker=str(marker)))
    folder = _write_config(tmp_path / "repo", {"tool_class": "Evil", "module": str(outside)})
    with pytest.raises(ValueError, match="outside the tool repository"):
        load_tool(folder, trust_remote_code=True)
    assert not marker.exists()


def test_symlink_escaping_the_folder_is_refused(tmp_path):
    marker = tmp_path / "ran.txt"
    outside = tmp_path / "outside.py"
    outside.write_text(MARKER_SOURCE.format(marker=str(marker)))
    folder = _write_config(tmp_path / "repo", {"tool_class": "Evil", "module": "tool.py"})
    os.symlink(outside, folder / "tool.py")
    with pytest.raises(ValueError, match="symlink"):
        load_tool(folder, trust_remote_code=True)
    assert not marker.exists()


def test_builtin_data_file_outside_the_repository_is_refused(tmp_path):
    private = tmp_path / "private.jsonl"
    private.write_text(json.dumps({"title": "secret", "text": "the password is hunter2"}) + "\n")
    for documents in ("../private.jsonl", str(private)):
        folder = _write_config(
            tmp_path / "repo", {"tool_class": "textenv.tools.WikiSearch", "init_kwargs": {"documents": documents}}
        )
        with pytest.raises(ValueError, match="outside the tool repository"):
            load_tool(folder)


@pytest.mark.parametrize("tool_class", ["os.system", "textenv.tools.NotATool", "subprocess.Popen"])
def test_unknown_class_without_module_is_refused(tmp_path, tool_class):
    folder = _write_config(tmp_path / "repo", {"tool_class": tool_class, "init_kwargs": {"command": "echo hi"}})
    with pytest.raises(ValueError):
        load_tool(folder, trust_remote_code=True)


def test_missing_or_broken_config(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_tool(tmp_path / "does-not-exist")
    with pytest.raises(FileNotFoundError):
        load_tool("./relative/missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="tool_config.json"):
        load_tool(empty)
    (empty / "tool_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_tool(empty)


# --- the Hub path (snapshot_download is replaced by a local folder: tests our path and trust logic) --


def test_hub_repo_id_goes_through_snapshot_download(tmp_path, monkeypatch):
    folder = save_tool(Calculator(legacy_format=True), tmp_path / "hub-calc")
    calls = []

    def fake_snapshot_download(repo_id, revision=None, repo_type=None, **kwargs):
        calls.append((repo_id, revision, repo_type))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    tool = load_tool("someone/calculator", revision="v1")
    assert calls == [("someone/calculator", "v1", None)]
    assert tool("13-3") == "10.0"


def test_hub_falls_back_to_spaces_where_legacy_tools_lived(tmp_path, monkeypatch):
    folder = save_tool(Calculator(), tmp_path / "space")
    calls = []

    def fake_snapshot_download(repo_id, revision=None, repo_type=None, **kwargs):
        calls.append(repo_type)
        if repo_type is None:
            error = RepositoryNotFoundError.__new__(RepositoryNotFoundError)
            error.args = ("404: no such model repo",)
            raise error
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert isinstance(load_tool("someone/space-calculator"), Calculator)
    assert calls == [None, "space"]


def test_legacy_example_tool_ids_load_offline_as_builtins(monkeypatch):
    def no_download(*args, **kwargs):
        raise AssertionError("a legacy tool id must not reach the Hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_download)
    calculator = load_tool("ybelkada/simple-calculator")
    assert isinstance(calculator, Calculator) and calculator("13-3") == "10.0"  # the legacy tool's format
    interpreter = load_tool("lvwerra/python-interpreter", timeout=2)
    assert isinstance(interpreter, PythonInterpreter) and interpreter.timeout == 2


def test_downloaded_config_cannot_loosen_the_sandbox_without_trust(tmp_path, monkeypatch):
    folder = save_tool(PythonInterpreter(timeout=600, allow_subprocesses=True), tmp_path / "loose")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kwargs: str(folder))
    with pytest.raises(ValueError, match=r"sandbox limits \['allow_subprocesses', 'timeout'"):
        load_tool("someone/loose-interpreter")
    trusted = load_tool("someone/loose-interpreter", trust_remote_code=True)
    assert trusted.timeout == 600 and trusted.allow_subprocesses
    assert load_tool(folder).timeout == 600  # a local folder is the user's own: no trust needed


def _hub_cache_layout(tmp_path, target_outside=False):
    """A folder laid out like the Hub cache: snapshots/<rev>/tool.py is a symlink into ../../blobs."""
    repo = tmp_path / "models--someone--shout"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    blob = (tmp_path / "elsewhere.py") if target_outside else (blobs / "0f1e2d")
    blob.write_text(USER_TOOL_SOURCE)
    os.symlink(os.path.relpath(blob, snapshot), snapshot / "shout_tool.py")
    (snapshot / "tool_config.json").write_text(json.dumps({"tool_class": "Shout", "module": "shout_tool.py"}))
    return snapshot


def test_hub_code_repository_needs_trust_and_its_blob_symlinks_are_allowed(tmp_path, monkeypatch):
    snapshot = _hub_cache_layout(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kwargs: str(snapshot))
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        load_tool("someone/shout")
    assert load_tool("someone/shout", trust_remote_code=True)("hi") == "HI!"


def test_hub_symlink_outside_the_repo_cache_is_refused(tmp_path, monkeypatch):
    snapshot = _hub_cache_layout(tmp_path, target_outside=True)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kwargs: str(snapshot))
    with pytest.raises(ValueError, match="outside the tool repository"):
        load_tool("someone/shout", trust_remote_code=True)
