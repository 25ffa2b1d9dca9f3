"""The test suite's two tiers, and when a module of the slow one may be skipped.

* **The judge tier** (marker ``judge``): the modules under ``JUDGE_TESTS`` and those named in
  ``JUDGE_MODULES``: tests whose subject is the real judge, or that judge kernels with it (each
  compiles for the TPU, interprets on the CPU, runs sandboxes). Most of the suite's time.
* **The rest**: the search, the run, the archive, MLflow, the CLI, the operators' rewrites (with
  the fake judge, tests/fake_judge.py), and one real end-to-end test per user path. Always run.

``python -m tests.tiers record [pytest args]`` runs the judge tier and writes ``tests/judged.json``:
for each of its modules whose every test passed, a fingerprint of everything that module's
verdicts can depend on. ``scripts/test.sh`` then skips a module of the tier while its fingerprint
is the same (``PALLAS_EVOLVE_TIERS=1``: tests/conftest.py deselects it and says so); a module not
in the record, or whose fingerprint moved, runs. ``bash scripts/test.sh --all`` runs everything.

Why an unchanged fingerprint cannot hide a change. A module's fingerprint is a SHA-256 over the
versions of Python, jax, jaxlib and libtpu, and the bytes of:

1. every file under evaluator/, seeds/ and examples/ (the judge, and its trusted runner and jailed
   worker, which import only these, jax and the standard library), listed anew at each check, so
   a file added or removed moves it;
2. the module itself, every other file in its folder that is not a test module (conftests, kernels,
   candidates, goldens) and below it, tests/conftest.py, the fake judge, the tests' helpers and
   pyproject.toml (the pins);
3. every project file the record's pytest processes imported (the tier runs alone there, so these
   are what its modules and their helpers import), kept in judged.json and hashed again;
4. every project file a process that the module's tests started imported (``python -m evolve``
   and the like: a ``sitecustomize`` on the tests' ``PYTHONPATH`` writes each process's project
   modules when it exits, under the test that was running, from ``PYTEST_CURRENT_TEST``).

A test of the module can only behave differently if one of those bytes or versions did, or the
machine did (cores, memory, wall-clock budgets): the full run after every judge change, and
``--all`` at any time, cover that.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tests" / "judged.json"
JUDGE_DIRS = ("evaluator", "seeds", "examples")
JUDGE_TESTS = ("tests/evaluator/", "tests/seeds/")
# Modules elsewhere whose tests judge kernels with the real judge (Ray's: on a real Ray cluster).
JUDGE_MODULES = (
    "tests/evolve/cli/test_eval.py", "tests/evolve/test_graft.py", "tests/evolve/test_user_styles.py",
    "tests/evolve/test_ablate.py", "tests/evolve/executors/test_ray_executor.py",
    "tests/mutations/test_accumulator.py", "tests/mutations/test_buffering.py", "tests/mutations/test_fidelity.py",
    "tests/mutations/test_fuse_epilogue.py", "tests/mutations/test_grid_order.py",
    "tests/mutations/test_mutation_property.py", "tests/mutations/test_mutation_slow.py",
    "tests/mutations/test_mxu_operands.py", "tests/mutations/test_production_kernels.py",
    "tests/mutations/test_rpa_operators.py",
)
# (This file is not among them: it chooses which modules run and records them; what it does is
# tests/test_tiers.py's subject, which always runs.)
HELPERS = ("tests/conftest.py", "tests/fake_judge.py", "tests/judging.py", "tests/procs.py",
           "tests/cli_runs.py", "tests/__init__.py", "pyproject.toml")


def rel(path: Path | str) -> str:
    return Path(path).resolve().relative_to(ROOT).as_posix()


def in_judge_tier(path: Path | str) -> bool:
    try:
        r = rel(path)
    except ValueError:            # a test file outside the repository (a plugin's, made by a test)
        return False
    return r.startswith(JUDGE_TESTS) or r in JUDGE_MODULES


def _files_under(folder: Path) -> set[str]:
    """The files under ``folder`` a fresh clone has too: no cache (``__pycache__``, ``.ruff_cache``,
    any folder or file whose name starts with a dot)."""
    return {rel(p) for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts
            and not any(part.startswith(".") for part in p.relative_to(folder).parts)}


def _common() -> set[str]:
    out = {p for p in HELPERS if (ROOT / p).exists()}
    for folder in JUDGE_DIRS:
        out |= _files_under(ROOT / folder)
    return out


def _own(module: str) -> set[str]:
    """The module and what sits beside it that is not another test module (and all below it)."""
    folder = (ROOT / module).parent
    return {module} | {f for f in _files_under(folder) if not Path(f).name.startswith("test_")}


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for name in ("jax", "jaxlib", "libtpu"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def fingerprint(files: set[str]) -> str:
    digest = hashlib.sha256(json.dumps(_versions(), sort_keys=True).encode())
    for name in sorted(files):
        path = ROOT / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"<missing>") + b"\0")
    return digest.hexdigest()


SELF = {"tests/tiers.py", "tests/judged.json"}     # the selection and its record: not what a module runs


def _test_imports(module: str, seen: set[str] | None = None) -> set[str]:
    """The test modules ``module`` imports (``from tests.evolve.test_x import ...``), and theirs."""
    import ast

    seen = set() if seen is None else seen
    try:
        tree = ast.parse((ROOT / module).read_text())
    except (OSError, SyntaxError):
        return seen
    for node in ast.walk(tree):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        for name in names:
            path = name.replace(".", "/") + ".py"
            if name.startswith("tests.") and (ROOT / path).is_file() and path not in seen:
                seen.add(path)
                _test_imports(path, seen)
    return seen


def _module_files(module: str, common: set[str], record: dict) -> set[str]:
    """What ``module``'s verdicts can depend on. The record's pytest processes collected every test
    module of the suite (collection imports them all), so the other test modules count only where
    this one imports them."""
    started = set(record["modules"][module]["started"])
    imported = {f for f in record.get("in_process", []) if not Path(f).name.startswith("test_")}
    return (common | _own(module) | imported | _test_imports(module) | started) - SELF


def unchanged_modules() -> tuple[dict[str, dict], str]:
    """The judge tier's modules whose recorded fingerprint still holds, and a line saying so."""
    if not RECORD.is_file():
        return {}, "judge tier: no record (tests/judged.json); every module of it runs"
    record = json.loads(RECORD.read_text())
    common = _common()
    same = {m: v for m, v in record["modules"].items()
            if (ROOT / m).is_file() and fingerprint(_module_files(m, common, record)) == v["fingerprint"]}
    moved = len(record["modules"]) - len(same)
    v = record["versions"]
    dates = sorted({m.get("date", record["date"]) for m in same.values()}) or [record["date"]]
    when = dates[0] if len(dates) == 1 else f"between {dates[0]} and {dates[-1]}"
    return same, (f"judge tier: {len(same)} modules skipped ({sum(m['passed'] for m in same.values())} tests that "
                  f"passed {when} with jax {v['jax']}, libtpu {v['libtpu']}, and nothing they read has "
                  f"changed since: tests/tiers.py); {moved} recorded modules run again; 'bash scripts/test.sh --all' "
                  "runs every one")


# ---- recording --------------------------------------------------------------------------------------
def log_imports(log_dir: str, tag: str) -> None:
    """Write this process's project modules (files relative to the repository) to log_dir, under tag."""
    seen = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        try:
            name = rel(path) if path else None
        except ValueError:
            continue
        if name and name.endswith(".py") and not name.startswith(".venv/"):
            seen.add(name)
    try:
        Path(log_dir, f"{tag}.{os.getpid()}.txt").write_text("\n".join(sorted(seen)) + "\n")
    except OSError:
        pass     # a jailed child cannot write here; its files are under evaluator/ and seeds/ anyway


def started_tag() -> str:
    """The module of the test that started this process (pytest names it in PYTEST_CURRENT_TEST)."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    return "started~" + current.split("::")[0].replace("/", "~") if current else "started~none"


def _passed_by_module(junit: Path) -> tuple[dict[str, int], set[str]]:
    passed: dict[str, int] = {}
    failed: set[str] = set()
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        while module and not (ROOT / ("/".join(module) + ".py")).is_file():
            module = module[:-1]                     # a class inside the module
        name = "/".join(module) + ".py"
        if case.find("failure") is not None or case.find("error") is not None:
            failed.add(name)
        elif case.find("skipped") is None:
            passed[name] = passed.get(name, 0) + 1
    return passed, failed


def _snapshot() -> dict[str, str]:
    """Every file of the repository (but its venv, git and caches) -> the SHA-256 of its bytes."""
    out = {}
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        if parts[0] in (".venv", ".git") or "__pycache__" in parts or not path.is_file():
            continue
        out[path.relative_to(ROOT).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def record(pytest_args: list[str]) -> int:
    """Run the judge tier; write tests/judged.json for each module whose every test passed, none of
    whose files changed while it ran."""
    before = _snapshot()
    with tempfile.TemporaryDirectory(prefix="pallas-evolve-imports-") as logs:
        env = dict(os.environ, PALLAS_EVOLVE_IMPORT_LOG=logs)
        env.pop("PALLAS_EVOLVE_TIERS", None)
        junit = Path(logs) / "report.xml"
        started = dt.datetime.now(dt.UTC)
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m",
                               "judge and not slow", f"--junitxml={junit}", *pytest_args], cwd=ROOT, env=env)
        if not junit.is_file():
            print("judge tier: pytest ran no test; nothing recorded", file=sys.stderr)
            return proc.returncode or 1
        passed, failed = _passed_by_module(junit)
        deselected = Path(logs) / "deselected.list"
        failed |= set(deselected.read_text().split()) if deselected.is_file() else set()   # not run whole
        in_process: set[str] = set()
        started_by: dict[str, set[str]] = {}
        for log in Path(logs).glob("*.txt"):
            files = {line for line in log.read_text().splitlines() if line}
            tag = log.name.split(".")[0]
            if tag == "pytest":
                in_process |= files
            else:
                started_by.setdefault(tag.removeprefix("started~").replace("~", "/"), set()).update(files)
    after = _snapshot()
    moved = {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}
    record = {"date": started.strftime("%Y-%m-%d %H:%M UTC"), "versions": _versions(),
              "minutes": round((dt.datetime.now(dt.UTC) - started).total_seconds() / 60, 1),
              "command": " ".join(["python -m tests.tiers record", *pytest_args]),
              "in_process": sorted(in_process - {"tests/judged.json"}), "modules": {}}
    common = _common()
    kept = []
    if RECORD.is_file():          # what an earlier record holds and this run did not run: kept if it still holds
        earlier = json.loads(RECORD.read_text())
        for module, entry in earlier.get("modules", {}).items():
            if module not in passed and module not in failed and (ROOT / module).is_file() and \
                    fingerprint(_module_files(module, common, earlier)) == entry["fingerprint"]:
                record["modules"][module] = {"date": earlier["date"], **entry}
                kept.append(module)
        if kept:                  # (the union of both runs' imports: more files, never fewer)
            record["in_process"] = sorted(set(record["in_process"]) | set(earlier.get("in_process", [])))
    for module in kept:
        record["modules"][module]["fingerprint"] = fingerprint(_module_files(module, common, record))
    for module in sorted(set(passed) - failed):
        record["modules"][module] = {"passed": passed[module], "started": sorted(started_by.get(module, set())),
                                     "date": record["date"]}
        files = _module_files(module, common, record)
        if files & moved:                 # what it ran is not what is here now: not recorded
            failed.add(module)
            del record["modules"][module]
            continue
        record["modules"][module]["fingerprint"] = fingerprint(files)
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    failed = {m for m in failed if in_judge_tier(ROOT / m)}
    left = f"; not recorded (a test failed, was not run, or a file it reads changed meanwhile): " \
           f"{', '.join(sorted(failed))}" if failed else ""
    print(f"judge tier: {len(record['modules'])} modules recorded in {rel(RECORD)}{left}", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "record":
        sys.exit(record(sys.argv[2:]))
    if len(sys.argv) >= 2 and sys.argv[1] == "check":
        print(unchanged_modules()[1])
        sys.exit(0)
    print("usage: python -m tests.tiers record [pytest args] | check", file=sys.stderr)
    sys.exit(2)
