"""The sandboxed PythonInterpreter: normal use, then hostile snippets that must each end as a
``Tool error`` (or a contained result) within their limit, leaving the parent healthy."""

import os
import re
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from live_processes import own_children
from sandbox_probe import own_sandbox_parent, sandbox_processes
from textenv.tools import TOOL_ERROR_PREFIX, PythonInterpreter
from textenv.tools.python_interpreter import strip_code_fence
from textenv.tools.sandbox import process as sandbox_process

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox tests target Linux")

SECRET = "s3cr3t-value-from-the-parent-environment"


@pytest.fixture(scope="module")
def interpreter():
    return PythonInterpreter(timeout=3, memory_mb=256, max_output_chars=2000)


def _children_of_this_process() -> list[int]:
    return [process.pid for process in own_children()]


# --- normal use -----------------------------------------------------------------------------------


def test_prints_stdout(interpreter):
    assert interpreter("print(sum(range(10)))") == "45\n"


def test_final_expression_is_shown_like_a_notebook_cell(interpreter):
    assert interpreter("x = 2\nx * 21") == "42\n"
    assert interpreter("print('a')\nNone") == "a\n"


def test_code_fence_is_removed(interpreter):
    assert strip_code_fence("```python\nprint(1)\n```") == "print(1)"
    assert strip_code_fence("print(1)") == "print(1)"
    assert interpreter("```py\nprint(7 * 6)\n```") == "42\n"


def test_exception_is_a_tool_error_with_output_and_traceback(interpreter):
    result = interpreter("print('before')\n1/0")
    assert result.startswith(f"{TOOL_ERROR_PREFIX}exit code 1")
    assert "before\n" in result
    assert "ZeroDivisionError: division by zero" in result
    assert 'File "snippet.py", line 2' in result
    assert "<string>" not in result  # the bootstrap's own frames are hidden


def test_syntax_error_and_empty_code(interpreter):
    assert "SyntaxError" in interpreter("def (:")
    assert interpreter("   ") == f"{TOOL_ERROR_PREFIX}no code to run"


def test_sys_exit_code_is_reported(interpreter):
    assert interpreter("import sys; sys.exit(3)").startswith(f"{TOOL_ERROR_PREFIX}exit code 3")


def test_writing_inside_the_working_directory_is_allowed(interpreter):
    code = "open('notes.txt', 'w').write('hello')\nprint(open('notes.txt').read())"
    assert interpreter(code) == "hello\n"


def test_nothing_persists_and_the_temporary_directory_is_removed(interpreter):
    first = interpreter("import os\nopen('state.txt', 'w').write('x')\nprint(os.getcwd())").strip()
    assert os.path.basename(first).startswith("textenv-sandbox-")
    assert not os.path.exists(first)
    second = interpreter("import os\nprint(os.path.exists('state.txt'), os.getcwd())").split()
    assert second[0] == "False"
    assert second[1] != first


def test_concurrent_calls_from_threads_are_independent(interpreter):
    codes = [f"import time\ntime.sleep(0.2)\nprint({n} * {n})" for n in range(4)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(interpreter, codes))
    assert results == [f"{n * n}\n" for n in range(4)]


def test_layers_are_reported():
    layers = PythonInterpreter(timeout=3).run("pass").layers
    assert layers["audit_hook"] is True
    assert {"RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NOFILE", "RLIMIT_FSIZE"} <= set(layers["rlimits"])
    if os.geteuid() == 0 and isinstance(layers["uid"], int):
        assert layers["uid"] != 0


# --- hostile snippets -----------------------------------------------------------------------------


def test_infinite_loop_times_out(interpreter):
    raw = interpreter.run("while True:\n    pass")
    assert interpreter.format_result(raw).startswith(f"{TOOL_ERROR_PREFIX}timed out after 3 s")
    assert 3 <= raw.duration - raw.code_started_after < 5  # the code's own time, then the kill


def test_sleeping_forever_times_out_and_keeps_earlier_output():
    result = PythonInterpreter(timeout=1)("print('started')\nimport time\ntime.sleep(60)")
    assert result == f"{TOOL_ERROR_PREFIX}timed out after 1 s\nstarted\n"


def _slow_set_up(monkeypatch, seconds):
    """The child program, made to spend ``seconds`` setting up before its layers (as on a loaded machine)."""
    assert PythonInterpreter(timeout=3)("pass") == ""  # the interpreter is probed (once) with the real set-up
    monkeypatch.setattr(sandbox_process, "BOOTSTRAP", f"import time; time.sleep({seconds})\n" + sandbox_process.BOOTSTRAP)


def test_the_timeout_counts_from_when_the_code_starts_not_from_a_slow_set_up(monkeypatch):
    _slow_set_up(monkeypatch, 1.5)
    interpreter = PythonInterpreter(timeout=1)
    result = interpreter.run("import time\ntime.sleep(0.5)\nprint('done')")
    assert (result.stdout, result.timed_out) == ("done\n", False)
    assert 1.5 <= result.code_started_after < result.duration
    assert interpreter("print('started')\nimport time\ntime.sleep(60)") == f"{TOOL_ERROR_PREFIX}timed out after 1 s\nstarted\n"


def test_a_set_up_slower_than_its_limit_is_killed_and_named(monkeypatch):
    _slow_set_up(monkeypatch, 60)
    monkeypatch.setattr(sandbox_process, "SET_UP_SECONDS", 0.5)
    started = time.monotonic()
    result = PythonInterpreter(timeout=10)("print('never')")
    assert time.monotonic() - started < 5
    assert result == f"{TOOL_ERROR_PREFIX}the sandbox was not set up within 0.5 s (is the machine overloaded?)"


def test_ten_gigabyte_allocation_hits_the_memory_limit(interpreter):
    raw = interpreter.run("data = bytearray(10 * 1024 ** 3)\nprint(len(data))")
    result = interpreter.format_result(raw)
    assert not raw.timed_out  # refused at once, not left to the 3 s timeout
    assert result.startswith(f"{TOOL_ERROR_PREFIX}memory limit of 256 MB exceeded")
    assert "MemoryError" in result


def test_printing_a_billion_characters_is_cut_at_the_output_limit(interpreter):
    raw = interpreter.run("import sys\nfor _ in range(10 ** 6):\n    sys.stdout.write('x' * 1000)")
    result = interpreter.format_result(raw)
    assert (raw.output_limited, raw.timed_out) == (True, False)  # killed at the cap, not at the timeout
    assert result.startswith(f"{TOOL_ERROR_PREFIX}output limit of 2000 characters exceeded")
    assert len(result) < 2200


def test_one_billion_character_string_is_contained(interpreter):
    result = interpreter("print('x' * 10 ** 9)")
    assert result.startswith(TOOL_ERROR_PREFIX)
    assert len(result) < 2200


FORK_LOOP = """
import os, time
for i in range(300):
    try:
        pid = os.fork()
    except OSError as error:
        print('fork refused after', i, type(error).__name__)
        break
    if pid == 0:
        if i % 2:
            os.setsid()  # try to leave the process group
        time.sleep(60)
        os._exit(0)
    print('child', pid)
"""


def test_fork_loop_is_refused_by_default(interpreter):
    children_before = _children_of_this_process()
    result = interpreter(FORK_LOOP)
    assert "fork refused after 0 PermissionError" in result
    assert "child " not in result
    assert _children_of_this_process() == children_before


def test_fork_loop_is_bounded_and_no_child_survives_the_call():
    interpreter = PythonInterpreter(timeout=5, max_processes=16, max_output_chars=20_000, allow_subprocesses=True)
    children_before = _children_of_this_process()
    with own_sandbox_parent() as parent:
        started = time.monotonic()
        raw = interpreter.run(FORK_LOOP)
        elapsed = time.monotonic() - started
        assert sandbox_processes(parent) == [], "sandbox children outlived the call"
    forked = [int(pid) for pid in re.findall(r"child (\d+)", raw.stdout)]
    assert forked, raw.stdout + raw.stderr
    assert elapsed < 5
    assert _children_of_this_process() == children_before
    if os.geteuid() == 0 and not isinstance(raw.layers.get("uid"), int):
        pytest.skip("running as root without the uid switch: RLIMIT_NPROC is not enforced here")
    assert len(forked) < 16
    assert "fork refused after" in raw.stdout


def test_parent_environment_is_not_visible(monkeypatch, interpreter):
    monkeypatch.setenv("TEXTENV_TEST_SECRET", SECRET)
    code = (
        "import os\n"
        "print(sorted(os.environ))\n"
        "print(os.environ.get('TEXTENV_TEST_SECRET'))\n"
        "try:\n"
        "    print(open(f'/proc/{os.getppid()}/environ', 'rb').read())\n"
        "except OSError as error:\n"
        "    print('refused', type(error).__name__)\n"
    )
    result = interpreter(code)
    assert SECRET not in result
    assert "TEXTENV_TEST_SECRET" not in result.splitlines()[0]
    assert result.splitlines()[1] == "None"
    assert result.splitlines()[2] == "refused PermissionError"


def test_writing_outside_the_temporary_directory_is_refused(tmp_path, interpreter):
    target = tmp_path / "outside.txt"
    code = f"""
import os, shutil
attempts = [
    lambda: open({str(target)!r}, 'w').write('pwned'),
    lambda: os.close(os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)),
    lambda: (os.symlink({str(target)!r}, 'link'), open('link', 'w').write('pwned')),
    lambda: (open('local.txt', 'w').write('pwned'), shutil.move('local.txt', {str(target)!r})),
    lambda: os.system('echo pwned > {target}'),
]
for attempt in attempts:
    try:
        attempt()
        print('written')
    except OSError as error:
        print('refused', type(error).__name__)
"""
    result = interpreter(code)
    assert not target.exists()
    assert "written" not in result
    assert result.count("refused") == 5


def test_connecting_to_a_local_socket_is_refused(interpreter):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(5)
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hello')\n"
            "    print('connected')\n"
            "except OSError as error:\n"
            "    print('refused', type(error).__name__)\n"
        )
        result = interpreter(code)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing is waiting: the child never connected
    assert result.startswith("refused")


def test_the_parent_is_healthy_after_hostile_snippets(interpreter):
    assert interpreter("print('still fine')") == "still fine\n"
    assert os.getcwd()  # the parent's working directory is untouched
