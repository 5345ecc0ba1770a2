"""The sandbox confines reads: code run by PythonInterpreter cannot read the answer key, secrets, the
project's source or its parent's /proc entries, as root and as an ordinary user, also with the audit hook
off (the kernel layers hold alone); links do not let a read through; no process outlives its call; a caller
whose user already runs many threads can still use the sandbox, whose process limit still holds."""

import json
import os
import pwd
import re
import shutil
import signal
import site
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import textenv
from sandbox_probe import own_sandbox_parent, sandbox_processes
from textenv.tools import PythonInterpreter
from textenv.tools.sandbox.bootstrap import TEST_DISABLE_VARIABLE

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox tests target Linux")

PROJECT = Path(textenv.__file__).resolve().parent.parent
ANSWER_KEY = PROJECT / "examples" / "data" / "fictional_towns.jsonl"  # the trivia task's answers
SOURCE = PROJECT / "textenv" / "tools" / "python_interpreter.py"
ORDINARY_USER = "textenv-sbx"

# Tries every read it is given and prints {attempt: "read: ..." or "refused: <error type>"} as JSON.
ATTEMPTS = """
import json, os
results = {}
def attempt(name, action):
    try:
        results[name] = "read: " + repr(action())[:300]
    except Exception as error:
        results[name] = "refused: " + type(error).__name__
for name, path in TARGETS["files"].items():
    attempt(name, lambda path=path: open(path).read())
parent = TARGETS["parent_pid"]
attempt("parent_environ", lambda: open("/proc/%d/environ" % parent, "rb").read())
attempt("parent_cwd_link", lambda: os.readlink("/proc/%d/cwd" % parent))
attempt("parent_cwd_listing", lambda: os.listdir("/proc/%d/cwd/" % parent))
secret = TARGETS["files"]["tmp_secret"]
attempt("symlink_to_secret", lambda: (os.symlink(secret, "planted-symlink"), open("planted-symlink").read()))
attempt("hardlink_to_secret", lambda: (os.link(secret, "planted-hardlink"), open("planted-hardlink").read()))
own = TARGETS["files"]["home_secret"]  # as an ordinary user, a file of its own (the kernel's hard-link protection allows it)
attempt("hardlink_to_home_secret", lambda: (os.link(own, "planted-hardlink-2"), open("planted-hardlink-2").read()))
print(json.dumps(results))
"""

# Leaves a grandchild in a session of its own, sleeping; prints its pid as the sandbox sees it.
SETSID_DOUBLE_FORK = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(120)
        os._exit(0)
    os._exit(0)
time.sleep(0.3)
print("forked")
"""


def _plant(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture
def secrets():
    """A secret in $HOME and one in a world-readable folder of /tmp, removed afterwards."""
    token = f"secret-{uuid.uuid4().hex}"
    home_file = Path.home() / f".textenv-test-token-{uuid.uuid4().hex[:8]}"
    tmp_folder = Path("/tmp") / f"textenv-read-test-{uuid.uuid4().hex[:8]}"
    tmp_folder.mkdir(mode=0o755)
    tmp_folder.chmod(0o755)
    files = {"home_secret": _plant(home_file, token), "tmp_secret": _plant(tmp_folder / "secret.txt", token)}
    yield token, files
    home_file.unlink(missing_ok=True)
    shutil.rmtree(tmp_folder, ignore_errors=True)


def _attempts_code(files: dict, parent_pid: int | None) -> str:
    targets = {"files": {name: str(path) for name, path in files.items()}, "parent_pid": parent_pid}
    targets["files"].update(answer_key=str(ANSWER_KEY), project_source=str(SOURCE), project_readme=str(PROJECT / "README.md"))
    return f"TARGETS = {json.dumps(targets)}\n{ATTEMPTS}"


def _assert_all_refused(results: dict, token: str, raw: str) -> None:
    assert token not in raw
    read = {name: outcome for name, outcome in results.items() if not outcome.startswith("refused")}
    assert read == {}, f"reads that went through: {read}"


# --- as the user running the tests ----------------------------------------------------------------


def test_isolation_reports_the_layers_in_use():
    isolation = PythonInterpreter(timeout=5).isolation
    if not isolation.get("landlock") or isinstance(isolation["landlock"], str):
        pytest.skip(f"this kernel grants no Landlock: {isolation.get('landlock')}")
    assert isolation["missing"] == {}
    assert isolation["landlock"] >= 1 and isolation["pid_namespace"] is True and isolation["network_namespace"] is True
    assert isolation["audit_hook"] is True
    if os.geteuid() == 0:
        assert isinstance(isolation["uid"], int) and isolation["uid"] != 0
    # The project's own interpreter runs the code (as root too: the mount namespace exposes it to the uid).
    assert PythonInterpreter(timeout=5)("import sys\nprint(sys.prefix)") == sys.prefix + "\n"


@pytest.mark.parametrize("disabled", ["", "audit_hook"], ids=["all_layers", "kernel_layers_only"])
def test_reads_outside_the_allowed_paths_are_refused(secrets, monkeypatch, disabled):
    monkeypatch.setenv(TEST_DISABLE_VARIABLE, disabled)
    token, files = secrets
    result = PythonInterpreter(timeout=10).run(_attempts_code(files, os.getpid()))
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout)
    assert set(results) >= {"home_secret", "tmp_secret", "answer_key", "project_source", "parent_environ",
                            "parent_cwd_link", "parent_cwd_listing", "symlink_to_secret", "hardlink_to_secret",
                            "hardlink_to_home_secret"}
    _assert_all_refused(results, token, result.stdout + result.stderr)


def test_read_paths_and_the_standard_library_stay_readable(tmp_path):
    interpreter = PythonInterpreter(timeout=10, read_paths=[ANSWER_KEY])
    code = (
        "import decimal, fractions, json, sqlite3, zlib\n"
        f"print(open({str(ANSWER_KEY)!r}).readline()[:40])\n"
        "print(sqlite3.connect(':memory:').execute('select 6 * 7').fetchone()[0])\n"
        "open('notes.txt', 'w').write('mine')\n"
        "print(open('notes.txt').read())\n"
    )
    assert interpreter(code) == ANSWER_KEY.read_text().splitlines()[0][:40] + "\n42\nmine\n"
    refused = interpreter("import tqdm")  # site-packages is not allowed by default
    assert refused.startswith("Tool error") and ("PermissionError" in refused or "ModuleNotFoundError" in refused)


def test_site_packages_can_be_allowed_explicitly():
    site_packages = [path for path in site.getsitepackages() if os.path.isdir(os.path.join(path, "tqdm"))]
    if not site_packages:
        pytest.skip("tqdm is not installed in a site-packages folder")
    interpreter = PythonInterpreter(timeout=10, read_paths=site_packages)
    assert interpreter("import tqdm\nprint(tqdm.__name__)") == "tqdm\n"


def test_a_setsid_double_fork_child_is_gone_after_the_call():
    interpreter = PythonInterpreter(timeout=10, allow_subprocesses=True)
    with own_sandbox_parent() as parent:
        assert interpreter(SETSID_DOUBLE_FORK) == "forked\n"
        assert sandbox_processes(parent) == []


def test_with_subprocesses_allowed_only_readable_programs_start():
    code = (
        "import os, subprocess, sys\n"
        "print(subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True).stdout.strip())\n"
        "print(os.system('true'))\n"
    )
    assert PythonInterpreter(timeout=10, allow_subprocesses=True)(code) == "42\n32512\n"  # sh: exit 127
    shell_folders = sorted({os.path.dirname(os.path.realpath(shutil.which(name))) for name in ("sh", "true")})
    allowed = PythonInterpreter(timeout=10, allow_subprocesses=True, read_paths=shell_folders + ["/usr/lib"])
    assert allowed(code) == "42\n0\n"


def test_bad_read_paths_are_refused_with_the_argument_named(tmp_path):
    with pytest.raises(ValueError, match=r"read_paths.*does not exist"):
        PythonInterpreter(read_paths=[tmp_path / "missing"])
    with pytest.raises(TypeError, match=r"read_paths=.*pass a list of paths"):
        PythonInterpreter(read_paths=str(tmp_path))


def test_a_missing_layer_warns_and_strict_refuses(monkeypatch, caplog):
    strict_before = PythonInterpreter(timeout=5, strict=True)  # every layer present here
    monkeypatch.setenv(TEST_DISABLE_VARIABLE, "landlock,pid_namespace")
    with caplog.at_level("WARNING", logger="textenv.tools.python_interpreter"):
        loose = PythonInterpreter(timeout=5)
    assert "landlock (disabled for testing)" in caplog.text and "pid_namespace" in caplog.text
    assert set(loose.isolation["missing"]) == {"landlock", "pid_namespace"}
    assert loose("print(1)") == "1\n"
    with pytest.raises(RuntimeError, match=r"strict=True.*\n.*landlock"):
        PythonInterpreter(timeout=5, strict=True)
    refused = strict_before("print('ran')")  # each call checks again: the layers went missing after construction
    assert "ran" not in refused and "strict isolation: missing layers landlock, pid_namespace" in refused


def test_hub_python_interpreter_is_confined_and_its_config_cannot_widen_reads(tmp_path, monkeypatch):
    import huggingface_hub

    from textenv.tools import load_tool, save_tool

    interpreter = load_tool("lvwerra/python-interpreter", timeout=5)  # the legacy hub id: a built-in
    refused = interpreter(f"open({str(ANSWER_KEY)!r}).read()")
    # Landlock refuses the read, or (as root, checkout under a closed folder) the mount namespace hides the file.
    assert refused.startswith("Tool error") and ("PermissionError" in refused or "FileNotFoundError" in refused)
    assert ANSWER_KEY.read_text()[:30] not in refused
    folder = save_tool(PythonInterpreter(read_paths=[ANSWER_KEY]), tmp_path / "widened")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kwargs: str(folder))
    with pytest.raises(ValueError, match=r"sandbox limits \['read_paths'\]"):
        load_tool("someone/widened-interpreter")


# --- as an ordinary user --------------------------------------------------------------------------

ORDINARY_USER_SCRIPT = """
import json, os, sys
from textenv.tools import PythonInterpreter
attempts_code = sys.argv[1].replace('"parent_pid": null', '"parent_pid": %d' % os.getpid())
interpreter = PythonInterpreter(timeout=10, allow_subprocesses=True)
report = {"isolation": interpreter.isolation}
result = interpreter.run(attempts_code)
report["attempts"] = {"stdout": result.stdout, "stderr": result.stderr}
report["double_fork"] = interpreter(sys.argv[2])
print(json.dumps(report))
"""


def _ordinary_user() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("creating an ordinary user needs root; this run is already one (see the tests above)")
    for tool in ("useradd", "unshare", "setpriv", "mount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    try:
        return pwd.getpwnam(ORDINARY_USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", ORDINARY_USER], check=True)
        return pwd.getpwnam(ORDINARY_USER)


def _first_closed_ancestor(path: str) -> str | None:
    """The outermost folder above ``path`` that others may not enter, if any."""
    parts = path.strip("/").split("/")
    for depth in range(1, len(parts)):
        folder = "/" + "/".join(parts[:depth])
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None


def _exposing_mounts(paths: list[str]) -> str:
    """Shell commands (run as root in a private mount namespace) that let another user reach ``paths``
    wherever the checkout and the Python installation live: each path is bind-mounted aside, a tmpfs covers
    each closed folder above them (hiding everything else in it), and the paths are moved back into place."""
    paths = sorted({os.path.realpath(path) for path in paths})
    closed = sorted({folder for folder in map(_first_closed_ancestor, paths) if folder is not None})
    closed = [folder for folder in closed if not any(folder.startswith(other + "/") for other in closed)]
    if not closed:
        return ""
    hidden = [path for path in paths if any(path.startswith(folder + "/") for folder in closed)]
    hidden = [path for path in hidden if not any(path.startswith(other + "/") for other in hidden)]
    commands = [f'stage{index}=$(mktemp -d) && mount --bind "{path}" "$stage{index}"' for index, path in enumerate(hidden)]
    commands += [f'mount -t tmpfs -o mode=0755 tmpfs "{folder}"' for folder in closed]
    commands += [f'mkdir -p "{path}" && mount --move "$stage{index}" "{path}"' for index, path in enumerate(hidden)]
    return " && ".join(commands) + " && "


def _run_as(user: pwd.struct_passwd, args: list[str], env: dict) -> subprocess.CompletedProcess:
    """Run ``args`` as ``user`` with this project's own venv and source. Where they live under a folder
    others cannot enter (pyenv under /root, a checkout in a `mktemp -d` folder), a private mount namespace
    shows that user those paths only, the way the sandbox itself does for its uid."""
    needed = [sys.base_prefix, sys.prefix, str(PROJECT)]
    drop = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", "env", "-i"]
    drop += [f"{key}={value}" for key, value in env.items()]
    command = _exposing_mounts(needed) + 'exec "$@"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", command, "sh", *drop, *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def ordinary_user_runs():
    """Run the attempts and the double fork as an ordinary user, with all layers and without the PID namespace."""
    user = _ordinary_user()
    token = f"secret-{uuid.uuid4().hex}"
    home = Path(user.pw_dir)
    home_secret = _plant(home / ".cache" / "huggingface" / "token", token, mode=0o600)
    os.chown(home_secret, user.pw_uid, user.pw_gid)
    workspace = Path("/tmp") / f"textenv-ordinary-{uuid.uuid4().hex[:8]}"
    workspace.mkdir(mode=0o755)
    workspace.chmod(0o755)
    tmp_secret = _plant(workspace / "secret.txt", token)
    runs = {}
    try:
        for name, disabled in (("all_layers", ""), ("without_pid_namespace", "pid_namespace")):
            tmpdir = workspace / f"tmp-{name}"
            tmpdir.mkdir()
            os.chown(tmpdir, user.pw_uid, user.pw_gid)
            env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "TMPDIR": str(tmpdir), TEST_DISABLE_VARIABLE: disabled,
                   "PYTHONPATH": str(PROJECT)}
            # parent_pid null: the script puts in its own pid (the process that calls the sandbox)
            code = _attempts_code({"home_secret": home_secret, "tmp_secret": tmp_secret}, None)
            completed = _run_as(user, [sys.executable, "-c", ORDINARY_USER_SCRIPT, code, SETSID_DOUBLE_FORK], env)
            assert completed.returncode == 0, completed.stderr[-3000:]
            runs[name] = json.loads(completed.stdout.strip().splitlines()[-1])
            runs[name]["survivors"] = sandbox_processes(tmpdir)
            for pid in runs[name]["survivors"]:
                os.kill(pid, signal.SIGKILL)
        yield token, runs
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
        home_secret.unlink(missing_ok=True)


def test_as_an_ordinary_user_the_venv_interpreter_runs_with_every_layer(ordinary_user_runs):
    _, runs = ordinary_user_runs
    isolation = runs["all_layers"]["isolation"]
    assert isolation["uid"] == "not root" and isolation["missing"] == {}
    assert isolation["pid_namespace"] is True and isolation["landlock"] >= 1


def test_as_an_ordinary_user_reads_outside_the_allowed_paths_are_refused(ordinary_user_runs):
    token, runs = ordinary_user_runs
    attempts = runs["all_layers"]["attempts"]
    results = json.loads(attempts["stdout"])
    assert len(results) == 11
    _assert_all_refused(results, token, attempts["stdout"] + attempts["stderr"])


def test_as_an_ordinary_user_no_process_outlives_the_call(ordinary_user_runs):
    _, runs = ordinary_user_runs
    assert runs["all_layers"]["double_fork"] == "forked\n"
    assert runs["all_layers"]["survivors"] == []
    # The same check sees the grandchild when the PID namespace is off: it can fail.
    assert len(runs["without_pid_namespace"]["survivors"]) == 1


# --- as an ordinary user whose uid already runs many tasks -----------------------------------------

BUSY_CALLER_SCRIPT = """
import json, sys, threading
from concurrent.futures import ThreadPoolExecutor
from textenv.tools import PythonInterpreter
limit, one_fork, fork_bomb = int(sys.argv[1]), sys.argv[2], sys.argv[3]
for _ in range(4 * limit):
    threading.Thread(target=threading.Event().wait, daemon=True).start()
threads = int([line for line in open("/proc/self/status") if line.startswith("Threads:")][0].split()[1])
interpreter = PythonInterpreter(timeout=10, max_processes=limit, max_output_chars=20_000, allow_subprocesses=True)
report = {"caller_threads": threads, "isolation": interpreter.isolation, "simple": interpreter("print(1 + 1)"),
          "one_fork": interpreter(one_fork)}
with ThreadPoolExecutor(4) as pool:  # concurrent calls as one user, as pytest-xdist workers make them
    report["concurrent"] = list(pool.map(interpreter, [one_fork] * 8))
bomb = interpreter.run(fork_bomb)
report["fork_bomb"] = {"stdout": bomb.stdout, "stderr": bomb.stderr}
print(json.dumps(report))
"""
ONE_FORK = "import os\npid = os.fork()\nif pid == 0:\n    os._exit(7)\nprint(os.waitpid(pid, 0)[1] >> 8)"
FORK_BOMB = """
import os, time
for i in range(300):
    try:
        pid = os.fork()
    except OSError as error:
        print('fork refused after', i, type(error).__name__)
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    print('child', pid)
"""


@pytest.mark.parametrize("disabled", ["", "user_namespace"], ids=["own_user_namespace", "no_user_namespace"])
def test_as_an_ordinary_user_already_running_many_tasks_the_sandbox_works_and_bounds_forks(disabled):
    """A caller like a trainer, whose uid holds 4 * max_processes threads: RLIMIT_NPROC set before the user
    namespace made each call fail (EAGAIN at the first fork); now it counts the sandbox's tasks only."""
    user, limit = _ordinary_user(), 16
    tmpdir = Path("/tmp") / f"textenv-busy-caller-{uuid.uuid4().hex[:8]}"  # a folder that user can reach
    tmpdir.mkdir()
    os.chown(tmpdir, user.pw_uid, user.pw_gid)
    env = {"HOME": user.pw_dir, "PATH": "/usr/bin:/bin", "TMPDIR": str(tmpdir), TEST_DISABLE_VARIABLE: disabled,
           "PYTHONPATH": str(PROJECT)}
    try:
        completed = _run_as(user, [sys.executable, "-c", BUSY_CALLER_SCRIPT, str(limit), ONE_FORK, FORK_BOMB], env)
        survivors = sandbox_processes(tmpdir)
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    assert report["caller_threads"] > 4 * limit  # the uid holds at least these tasks
    assert (report["simple"], report["one_fork"], report["concurrent"]) == ("2\n", "7\n", ["7\n"] * 8), report
    forked = re.findall(r"child (\d+)", report["fork_bomb"]["stdout"])
    assert "fork refused after" in report["fork_bomb"]["stdout"] and survivors == [], report["fork_bomb"]
    isolation = report["isolation"]
    if not disabled:
        assert isolation["missing"] == {} and isolation["process_limit"] == "own user namespace"
        assert 0 < len(forked) < limit  # the bootstrap and the namespace's init count too
    else:  # on top of the uid's count at the start: other workers running as this user can shift it
        assert isolation["process_limit"].startswith("relative (no user namespace)")
        assert {"process_limit", "pid_namespace"} <= set(isolation["missing"])
        assert "process_limit (relative (no user namespace)" in completed.stderr  # the construction warning
        assert 0 < len(forked) < 300
