"""The suite's own machinery: the session's home, the fake judge as a plugin, and the judge tier's
fingerprint (tests/tiers.py), which must move with every file a module's verdicts can read."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from tests import tiers
from tests.fake_judge import VMEM_BLOCK_ELEMENTS, fake_verdict


def test_no_test_can_touch_the_users_home_or_default_cache():
    real = Path(pwd.getpwuid(os.getuid()).pw_dir).resolve()
    assert Path.home().resolve() != real
    assert Path.home() == Path(os.environ["PALLAS_EVOLVE_TEST_HOME"])
    from evaluator import Judge

    assert Path(Judge().references.cache_dir).is_relative_to(Path.home())


def test_the_fake_judge_is_an_executor_plugin_here_and_in_a_process_a_test_starts():
    from evolve.executors.base import EXECUTORS

    assert "fake" in EXECUTORS.names()
    out = subprocess.run([sys.executable, "-c", "from evolve.executors.base import EXECUTORS; "
                          "print(EXECUTORS.load('fake').__module__)"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "tests.fake_judge"


def test_the_fake_verdict_is_a_function_of_the_source():
    from evaluator import Provenance, Status
    from seeds import load_seed

    seed = load_seed("matmul")
    task, source = seed.task("M=256,K=256,N=256"), (seed.directory / "kernel.py").read_text()
    prov = Provenance(timing_source="compiler_estimate", chip="v5e")
    one, again = fake_verdict(source, task, prov), fake_verdict(source, task, prov)
    assert one == again and one.status is Status.PASS and one.metrics.estimated_cycles > 0
    assert "fake judge" in one.log_tail
    assert fake_verdict(source + "\n# edited\n", task, prov).metrics.estimated_cycles != one.metrics.estimated_cycles
    assert fake_verdict("def (", task, prov).status is Status.FAIL_SCREEN
    assert fake_verdict(source, task, prov, cut=1).status is Status.PRUNED
    assert VMEM_BLOCK_ELEMENTS > 256 * 256


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A repository of a few files, with tests/tiers.py pointed at it."""
    for name, text in {"evaluator/judge.py": "J = 1\n", "seeds/task.py": "T = 1\n", "evolve/search/loop.py": "S = 1\n",
                       "evolve/run.py": "R = 1\n", "tests/evaluator/test_a.py": "def test(): pass\n",
                       "tests/evaluator/kernels/k.py": "K = 1\n", "tests/evaluator/test_b.py": "B = 1\n",
                       "pyproject.toml": "[project]\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(tiers, "ROOT", tmp_path)
    monkeypatch.setattr(tiers, "RECORD", tmp_path / "tests" / "judged.json")
    record = {"date": "today", "versions": tiers._versions(),
              "in_process": ["evolve/run.py", "tests/evaluator/test_b.py"],     # collection imports every test module
              "modules": {"tests/evaluator/test_a.py": {"passed": 1, "started": ["evolve/search/loop.py"]}}}
    module = record["modules"]["tests/evaluator/test_a.py"]
    module["fingerprint"] = tiers.fingerprint(tiers._module_files("tests/evaluator/test_a.py", tiers._common(), record))
    tiers.RECORD.write_text(json.dumps(record))
    return tmp_path


def _skipped() -> set[str]:
    return set(tiers.unchanged_modules()[0])


@pytest.mark.parametrize("path", ["evaluator/judge.py", "seeds/task.py", "evolve/search/loop.py", "evolve/run.py",
                                  "tests/evaluator/test_a.py", "tests/evaluator/kernels/k.py", "pyproject.toml"])
def test_a_module_runs_again_when_a_file_it_reads_changes_and_not_otherwise(tree, path):
    assert _skipped() == {"tests/evaluator/test_a.py"}
    (tree / "tests/evaluator/test_b.py").write_text("B = 2\n")       # another test module: not read
    (tree / "evolve/other.py").write_text("O = 1\n")                 # a file nobody imported
    assert _skipped() == {"tests/evaluator/test_a.py"}
    original = (tree / path).read_text()
    (tree / path).write_text(original + "# changed\n")
    assert _skipped() == set()
    (tree / path).write_text(original)
    assert _skipped() == {"tests/evaluator/test_a.py"}


def test_a_file_added_to_the_judge_or_a_module_removed_runs_again(tree):
    (tree / "evaluator/new.py").write_text("N = 1\n")
    assert _skipped() == set()
    (tree / "evaluator/new.py").unlink()
    (tree / "tests/evaluator/test_a.py").unlink()
    assert _skipped() == set()


def test_other_versions_of_jax_run_everything_again(tree, monkeypatch):
    monkeypatch.setattr(tiers, "_versions", lambda: {"python": "3.11", "jax": "0.0.1", "jaxlib": "0", "libtpu": "0"})
    assert _skipped() == set()


def test_a_module_that_imports_another_test_module_runs_again_when_that_one_changes(tree):
    (tree / "tests/evaluator/test_a.py").write_text("from tests.evaluator.test_b import B\n\ndef test(): assert B\n")
    record = json.loads(tiers.RECORD.read_text())
    module = record["modules"]["tests/evaluator/test_a.py"]
    module["fingerprint"] = tiers.fingerprint(tiers._module_files("tests/evaluator/test_a.py", tiers._common(), record))
    tiers.RECORD.write_text(json.dumps(record))
    assert _skipped() == {"tests/evaluator/test_a.py"}
    (tree / "tests/evaluator/test_b.py").write_text("B = 2\n")
    assert _skipped() == set()
