"""Every plugin family takes a new member from outside the repository (seeds/registry.py): each test
writes the member into a temporary directory with a one-line entry point (an installed package's
metadata, as ``pip install`` would leave it) and uses it through the real commands. Nothing in the
repository is edited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
AXPY = ROOT / "examples" / "seed_axpy"
SHAPE = "M=64,N=256"


def install(where: Path, entry_points: dict[str, dict[str, str]], files: dict[str, str]) -> Path:
    """A package in ``where``: its ``files`` and the metadata of a distribution whose entry points
    are ``entry_points`` (group -> name -> target), found by importlib.metadata on sys.path."""
    for name, text in files.items():
        path = where / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    info = where / "my_plugins-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugins\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{n} = {t}\n" for n, t in members.items()) + "\n"
        for group, members in entry_points.items()))
    return where


def run(where: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=f"{where}{os.pathsep}{ROOT}")
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=cwd, env=env, check=False)


def test_a_timing_source_is_one_class_and_one_line(tmp_path, monkeypatch):
    from evaluator.judge import Judge, JudgeConfig
    from evaluator.figure.timing import timing_choices
    from evaluator.result import Status
    from seeds import load_seed

    where = install(tmp_path / "site", {"pallas_evolve.timing": {"twice": "my_timing:Twice"}}, {"my_timing.py": '''
        import dataclasses
        from evaluator.figure.timing.compiler_estimate import CompilerEstimate

        class Twice(CompilerEstimate):
            """The compiler estimate, doubled (a stand-in for a new way of timing)."""
            name = label = "twice"

            def read(self, scratch, stage_data, chip):
                t = super().read(scratch, stage_data, chip)
                return t if t.cycles is None else dataclasses.replace(t, cycles=2 * t.cycles, latency_s=2 * t.latency_s)
    '''})
    monkeypatch.syspath_prepend(str(where))
    assert "twice" in timing_choices()
    seed = load_seed(str(AXPY))
    task = seed.task(SHAPE)
    results = {name: Judge(JudgeConfig(timing=name, cache_dir=str(tmp_path / name))).evaluate(seed.kernel_source, task)
               for name in ("compiler_estimate", "twice")}
    assert all(r.status is Status.PASS for r in results.values()), [r.error for r in results.values()]
    assert results["twice"].provenance.timing_source == "twice"
    assert results["twice"].metrics.estimated_cycles == 2 * results["compiler_estimate"].metrics.estimated_cycles


def test_an_executor_is_one_class_and_one_line(tmp_path):
    where = install(tmp_path / "site", {"pallas_evolve.executors": {"inline": "my_executor:Inline"}},
                    {"my_executor.py": '''
        import concurrent.futures
        from evolve.executors.base import Executor

        class Inline(Executor):
            """Judges each candidate right away, in the calling thread."""
            name = "inline"

            def __init__(self, workers=0):
                super().__init__(1)

            def submit(self, fn, *args):
                future = concurrent.futures.Future()
                future.set_result(fn(*args))
                return future

            def shutdown(self, cancel=False):
                pass
    '''})
    data = tmp_path / "data"
    proc = run(where, "-m", "evolve", "run", "--seed", str(AXPY), "--shape", SHAPE, "--population", "3",
               "--generations", "1", "--no-peers", "--executor", "inline", "--data-dir", str(data), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = pd.concat(pd.read_parquet(p) for p in (data / "archive").rglob("*.parquet"))
    assert len(rows) >= 2 and (rows["status"] == "PASS").any()
    help_text = run(where, "-m", "evolve", "run", "--help", cwd=tmp_path).stdout
    assert "inline" in help_text


def test_a_seed_is_one_directory(tmp_path):
    task_py = (AXPY / "task.py").read_text().replace('name = "axpy"', 'name = "axpy_plugin"')
    assert 'name = "axpy_plugin"' in task_py
    where = install(tmp_path / "site", {"pallas_evolve.seeds": {"axpy_plugin": "my_seeds.axpy_plugin"}}, {
        "my_seeds/__init__.py": "", "my_seeds/axpy_plugin/__init__.py": "",
        "my_seeds/axpy_plugin/task.py": task_py, "my_seeds/axpy_plugin/kernel.py": (AXPY / "kernel.py").read_text()})
    listed = run(where, "-m", "evolve", "seeds", cwd=tmp_path)
    assert listed.returncode == 0 and "axpy_plugin" in listed.stdout, listed.stderr
    proc = run(where, "-m", "evolve", "eval", str(AXPY / "kernel.py"), "--seed", "axpy_plugin", "--shape", SHAPE,
               "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["status"] == "PASS"


def test_an_operator_is_one_module_and_one_test_file(tmp_path):
    where = install(tmp_path / "site", {"pallas_evolve.operators": {"swap_add": "my_operator:SwapAdd"}}, {
        "my_operator.py": '''
            import libcst as cst
            from mutations import Applicability, NotApplicable, Operator

            class SwapAdd(Operator):
                name = "swap_add"
                description = "write alpha * x + y as y + alpha * x (an exact reordering)"

                def _check(self, module, task):
                    ok = "alpha * x + y" in module.code
                    return Applicability(ok, "" if ok else "no 'alpha * x + y' in the kernel")

                def _sample(self, module, task, rng):
                    return {}

                def _rewrite(self, module, task, params):
                    if "alpha * x + y" not in module.code:
                        raise NotApplicable("no 'alpha * x + y' in the kernel")
                    return cst.parse_module(module.code.replace("alpha * x + y", "y + alpha * x"))
        ''',
        "test_swap_add.py": f'''
            from mutations import get_operator, replay
            from seeds import load_seed

            def test_it_applies_to_axpy_and_replays():
                seed = load_seed({str(AXPY)!r})
                task = seed.task({SHAPE!r})
                result = get_operator("swap_add").apply_params(seed.kernel_source, task, {{}})
                assert result.applied and "y + alpha * x" in result.source
                assert replay(seed.kernel_source, [result.edit], task).source == result.source
        '''})
    # Its own test file, and the contract suite every operator runs (which finds it by itself).
    proc = run(where, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(where / "test_swap_add.py"),
               str(ROOT / "tests/mutations/test_operator_contract.py"), "-k", "swap_add", cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "passed" in proc.stdout and " failed" not in proc.stdout
    count = int(proc.stdout.strip().splitlines()[-1].split(" passed")[0].split()[-1])
    assert count > 5, proc.stdout[-500:]      # its own test and the contract suite's cases for it
    mutated = run(where, "-m", "evolve", "mutate", str(AXPY / "kernel.py"), "--seed", str(AXPY), "--shape", SHAPE,
                  "--op", "swap_add", cwd=tmp_path)
    assert mutated.returncode == 0 and "y + alpha * x" in mutated.stdout, mutated.stderr


@pytest.mark.parametrize("family", ["operators", "seeds", "timing", "executors", "strategies"])
def test_every_family_is_one_registry_style(family):
    from evaluator.figure.timing import TIMING_SOURCES
    from evolve.executors.base import EXECUTORS
    from evolve.search.strategies import STRATEGIES
    from mutations.registry import OPERATORS
    from seeds import SEEDS
    from seeds import Registry

    registry = {"operators": OPERATORS, "seeds": SEEDS, "timing": TIMING_SOURCES, "executors": EXECUTORS,
                "strategies": STRATEGIES}[family]
    assert isinstance(registry, Registry) and registry.group == f"pallas_evolve.{family}"
    for name in registry.names():
        assert registry.load(name) is not None
    with pytest.raises(KeyError, match="unknown .*'no-such-member'; known: "):
        registry.load("no-such-member")
