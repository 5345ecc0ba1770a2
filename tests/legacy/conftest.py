"""Backend selection for the ported TRL 0.11.4 tests.

The test files import `textenv` / `textenv.core`. With ``TEXTENV_LEGACY_BACKEND=trl`` those names are
aliased to the real ``trl`` 0.11.4 package (``sys.modules["textenv"] = trl``, ``sys.modules["textenv.core"] =
trl.core``) before any test module is imported, so the very same files run against trl for comparison.
Use ``tests/legacy/run_on_trl.py`` (``make legacy-on-trl``) for that: it runs pytest in the legacy venv with
``--confcutdir=tests/legacy``, so that ``tests/conftest.py`` (which imports the real textenv) is not loaded.
Without the variable (or with ``TEXTENV_LEGACY_BACKEND=textenv``) nothing is aliased: the tests run
against textenv, as in ``make test``.
"""

import os
import sys

BACKEND = os.environ.get("TEXTENV_LEGACY_BACKEND", "textenv").strip().lower() or "textenv"

if BACKEND == "trl":
    if "textenv" in sys.modules and getattr(sys.modules["textenv"], "__name__", "") != "trl":
        raise RuntimeError(
            "TEXTENV_LEGACY_BACKEND=trl, but the real textenv package was imported before tests/legacy/conftest.py "
            "could alias it to trl (was tests/conftest.py loaded?). Run the legacy suite on trl with "
            "`python tests/legacy/run_on_trl.py` or `pytest --confcutdir=tests/legacy tests/legacy`."
        )
    import trl
    import trl.core

    sys.modules["textenv"] = trl
    sys.modules["textenv.core"] = trl.core
elif BACKEND != "textenv":
    raise RuntimeError(f"TEXTENV_LEGACY_BACKEND must be 'textenv' or 'trl', not {BACKEND!r}")


def pytest_report_header(config):
    if BACKEND == "trl":
        import transformers
        import trl

        return f"tests/legacy backend: trl {trl.__version__} (transformers {transformers.__version__})"
    return "tests/legacy backend: textenv"


# --- a test module that cannot be imported fails as one test instead of interrupting the session ---------
#
# pytest stops the whole run ("Interrupted: N errors during collection") when a test module fails to import.
# The ported modules import names that textenv may not (yet) provide; `make test` runs every test folder in
# one session, so such an ImportError would stop all the other tests. Instead, a module whose import fails
# here is collected as a single failing test `<module>::import` that reports the original error.

import pytest  # noqa: E402


class ModuleImportFailed(pytest.Item):
    def __init__(self, *, longrepr, **kwargs):
        super().__init__(**kwargs)
        self.import_error = longrepr

    def runtest(self):
        raise ImportError(str(self.import_error))

    def repr_failure(self, excinfo):
        return f"importing this test module failed, so none of its tests ran:\n{self.import_error}"

    def reportinfo(self):
        return self.path, None, f"{self.path.name}: import"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if report.failed and isinstance(collector, pytest.Module):
        item = ModuleImportFailed.from_parent(collector, name="import", longrepr=report.longrepr)
        return pytest.CollectReport(collector.nodeid, "passed", None, [item])
    return report
