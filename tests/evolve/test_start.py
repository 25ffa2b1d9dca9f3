"""`--start MODULE_OR_FILE` (issue 26): a kernel people already run, read from its installed
package at run time, judged by the seed's task; where it came from is in the run's record, every
archived row, lineage and MLflow; a resume starts from the same source or refuses; bad starts get
one line and exit status 2."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from evolve.errors import UsageError
from evolve.start.resolve import check_same_start, resolve_start
from seeds import load_seed
from tests.cli_runs import evolve

ROOT = Path(__file__).resolve().parents[2]
JAX_FA = "jax.experimental.pallas.ops.tpu.flash_attention"
SMALL = ("--shape", "B=1,H=2,N=256,D=128")


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p).encode() + p.read_bytes())
    return h.hexdigest()


# ---- resolving a start (no judge) -------------------------------------------------------------
def test_a_module_start_is_read_from_the_installed_package_with_its_version():
    import importlib.metadata

    seed = load_seed("flash_attention")
    start = resolve_start(JAX_FA, seed)
    origin = importlib.util.find_spec(JAX_FA).origin
    assert (start.kind, start.name, start.path) == ("module", JAX_FA, origin)
    assert start.source == Path(origin).read_text()
    assert (start.distribution, start.version) == ("jax", importlib.metadata.version("jax"))
    assert resolve_start("jax", seed) == dataclass_with_spec(start, "jax")   # the seed's short name
    assert start.record()["sha256"] == hashlib.sha256(start.source.encode()).hexdigest()


def dataclass_with_spec(start, spec):
    import dataclasses

    return dataclasses.replace(start, spec=spec)


def test_no_start_is_the_seeds_kernel_and_a_path_is_a_file(tmp_path):
    seed = load_seed("flash_attention")
    assert resolve_start(None, seed).source == seed.kernel_source
    kernel = tmp_path / "k.py"
    kernel.write_text("x = 1\n")
    start = resolve_start(str(kernel), seed)
    assert (start.kind, start.source, start.distribution) == ("file", "x = 1\n", None)
    assert start.label.startswith(f"file {kernel}")


def test_a_resume_refuses_a_start_whose_source_changed(tmp_path):
    seed = load_seed("flash_attention")
    kernel = tmp_path / "k.py"
    kernel.write_text("x = 1\n")
    recorded = resolve_start(str(kernel), seed).record()
    check_same_start(recorded, resolve_start(str(kernel), seed), "r1")
    check_same_start(None, resolve_start(str(kernel), seed), "r1")          # a run older than starts
    kernel.write_text("x = 2\n")
    with pytest.raises(UsageError, match="run r1 started from file .* but that start now reads"):
        check_same_start(recorded, resolve_start(str(kernel), seed), "r1")


# ---- the commands ----------------------------------------------------------------------------
def test_eval_start_judges_jax_s_own_module():
    r = evolve("eval", "--start", JAX_FA, *SMALL, "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["status"] == "PASS", out["error"]
    assert out["start"]["kind"] == "module" and out["start"]["name"] == JAX_FA
    assert out["start"]["distribution"] == "jax"


@pytest.fixture(scope="module")
def started_run(tmp_path_factory):
    data = tmp_path_factory.mktemp("start") / "data"
    r = evolve("run", "--start", "jax", *SMALL, "--population", "3", "--generations", "0", "--no-peers",
               "--executor", "fake", "--data-dir", str(data))        # the start is the subject: the fake judge
    assert r.returncode == 0, r.stderr[-3000:]
    (run_id,) = [p.stem for p in (data / "runs").glob("*.json")]
    return data, run_id, r


def test_a_run_records_its_start_in_meta_archive_lineage_and_mlflow(started_run):
    from archive import Archive

    data, run_id, r = started_run
    meta = Archive(data).read_run_meta(run_id)
    assert meta["config"]["task"]["start"] == "jax"
    assert meta["start"]["name"] == JAX_FA and meta["start"]["distribution"] == "jax" and meta["start"]["version"]
    df = Archive(data).evaluations(run_id)
    assert len(df) >= 1 and df["start"].eq(meta["start"]["label"]).all()
    seed_row = df[df["operator"] == "seed"].iloc[0]
    assert seed_row["source"] == Path(importlib.util.find_spec(JAX_FA).origin).read_text()
    assert f"start: {meta['start']['label']}" in r.stdout

    lineage = evolve("lineage", str(seed_row["individual_id"]), "--data-dir", str(data), "--format", "json")
    assert lineage.returncode == 0, lineage.stderr
    doc = json.loads(lineage.stdout)
    assert doc["start"] == meta["start"]["label"] and doc["chain"][0]["start"] == meta["start"]["label"]

    from mlflow.tracking import MlflowClient

    from mlflow_runs._store import tracking_uri_for

    client = MlflowClient(tracking_uri=tracking_uri_for(data))
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parents = [x for x in runs if "start.name" in x.data.params]
    assert len(parents) == 1 and parents[0].data.params["start.name"] == JAX_FA
    assert parents[0].data.params["start.version"] == meta["start"]["version"]
    children = [x for x in runs if x not in parents]
    assert children and all(x.data.tags.get("start") == meta["start"]["label"] for x in children)


def test_resume_starts_from_the_same_source_and_refuses_a_changed_one(started_run, tmp_path):
    import shutil

    data, run_id, _ = started_run
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    r = evolve("resume", run_id, "--data-dir", str(copy))
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"start: {JAX_FA} (jax " in r.stdout
    assert "(0 judged," in r.stderr              # the same start: every verdict came back from the archive

    meta_path = copy / "runs" / f"{run_id}.json"
    meta = json.loads(meta_path.read_text())
    meta["start"]["sha256"] = "0" * 64                    # as if jax were upgraded since
    meta_path.write_text(json.dumps(meta))
    untouched = _digest(copy)
    r = evolve("resume", run_id, "--data-dir", str(copy))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "but that start now reads" in lines[0], r.stderr
    assert _digest(copy) == untouched


BAD_STARTS = [
    ("no.such.module", "cannot find module no.such.module"),
    (f"{JAX_FA}_nope", "no such module"),
    ("jax.experimental.pallas.ops.tpu.megablox", "is a package, not a kernel module"),
    ("math", "has no Python source file"),
    ("/no/such/kernel.py", "no kernel file at /no/such/kernel.py"),
]


@pytest.mark.parametrize("command, start, fragment", [
    *((["eval"], start, fragment) for start, fragment in BAD_STARTS),
    *((command, *BAD_STARTS[0]) for command in (["mutate", "--op", "block_sizes"], ["run"], ["ablate"], ["bench"])),
    (["run"], *BAD_STARTS[-1]),
    (["eval", str(ROOT / "seeds" / "flash_attention" / "kernel.py")], "jax", "give a FILE or --start, not both"),
])
def test_a_bad_start_gets_one_line_exit_2_and_stores_nothing(command, start, fragment, tmp_path):
    data = tmp_path / "data"
    extra = ["--data-dir", str(data)] if command[0] in ("run", "bench") else []
    r = evolve(*command, "--start", start, *SMALL, *extra)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], r.stderr
    assert r.stdout == "" and not data.exists()
