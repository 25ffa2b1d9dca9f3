"""What every test shares.

* A home of the session's own: ``HOME`` points into a temporary directory for the whole session
  (and every process it starts), so no test reads or writes the user's ``~/.cache/pallas-evolve``
  (the judge's default reference cache) or any other dotfile; xdist's workers share it.
* The fake judge (tests/fake_judge.py) as a plugin: a distribution's metadata with one entry point,
  ``pallas_evolve.executors: fake``, on ``sys.path`` and ``PYTHONPATH``, so ``--executor fake``
  works in this process and in every ``python -m evolve`` a test starts, through the same
  entry-point group a user's package would use.
* The tiers (tests/tiers.py): every test of the judge tier carries the ``judge`` marker.
* ``judge``: one real judge for the session (v5e, the compiler's estimate), on the session's cache.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_OWNER = "PALLAS_EVOLVE_TEST_HOME_OWNER"


_SITECUSTOMIZE = """import os
if os.environ.get("PALLAS_EVOLVE_IMPORT_LOG"):   # tests/tiers.py record: what each process imported
    import atexit

    def _log():
        import sys
        if "_pytest" in sys.modules:     # a pytest process: tests/conftest.py logs it
            return
        try:
            from tests.tiers import log_imports, started_tag
            log_imports(os.environ["PALLAS_EVOLVE_IMPORT_LOG"], started_tag())
        except Exception:
            pass

    atexit.register(_log)
"""


def _plugin_dir(base: Path) -> Path:
    site = base / "plugins"
    info = site / "pallas_evolve_test_fakes-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pallas-evolve-test-fakes\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[pallas_evolve.executors]\nfake = tests.fake_judge:FakeExecutor\n")
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return site


def pytest_configure(config):
    if os.environ.get("PALLAS_EVOLVE_TEST_HOME"):        # an xdist worker: the controller made it
        base = Path(os.environ["PALLAS_EVOLVE_TEST_HOME"]).parent
    else:
        base = Path(tempfile.mkdtemp(prefix="pallas-evolve-tests-"))
        (base / "home").mkdir()
        os.environ["PALLAS_EVOLVE_TEST_HOME"] = str(base / "home")
        os.environ[_OWNER] = str(os.getpid())
        os.environ["HOME"] = str(base / "home")
        site = _plugin_dir(base)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(site), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    site = str(base / "plugins")
    if site not in sys.path:
        sys.path.insert(0, site)


def pytest_collection_modifyitems(config, items):
    from tests.tiers import in_judge_tier, rel, unchanged_modules

    for item in items:
        if in_judge_tier(item.path):
            item.add_marker(pytest.mark.judge)
    if os.environ.get("PALLAS_EVOLVE_TIERS") != "1":
        return
    same, _ = unchanged_modules()       # the same in every xdist worker: each collects alike
    skip = {item.nodeid for item in items if in_judge_tier(item.path) and rel(item.path) in same}
    if skip:
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in skip])
        items[:] = [item for item in items if item.nodeid not in skip]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if os.environ.get("PALLAS_EVOLVE_TIERS") == "1":
        from tests.tiers import unchanged_modules

        terminalreporter.write_line(unchanged_modules()[1])


def pytest_deselected(items):
    """Under tests/tiers.py's record: a module not run whole (-k, a node id) is not recorded."""
    if os.environ.get("PALLAS_EVOLVE_IMPORT_LOG"):
        from tests.tiers import rel

        partial = {rel(item.path) for item in items if item.get_closest_marker("slow") is None}
        with open(Path(os.environ["PALLAS_EVOLVE_IMPORT_LOG"]) / "deselected.list", "a") as fh:
            fh.write("".join(f"{m}\n" for m in sorted(partial)))


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("PALLAS_EVOLVE_IMPORT_LOG"):
        from tests.tiers import log_imports

        log_imports(os.environ["PALLAS_EVOLVE_IMPORT_LOG"], "pytest")


def pytest_unconfigure(config):
    if os.environ.get(_OWNER) == str(os.getpid()):
        shutil.rmtree(Path(os.environ["PALLAS_EVOLVE_TEST_HOME"]).parent, ignore_errors=True)


@pytest.fixture(scope="session")
def judge():
    """One real judge for the session: v5e, the compiler's estimate, two workers, its reference
    cache in the session's home (one trusted reference per task, shared by every test)."""
    from evaluator import Judge, JudgeConfig, StageBudgets

    budgets = StageBudgets(load_s=60, lower_s=60, compile_s=120, correctness_s=120)
    return Judge(JudgeConfig(chip="v5e", budgets=budgets, workers=min(2, os.cpu_count() or 1)))
