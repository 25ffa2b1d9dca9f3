"""Each built-in seed's SIGNATURE says what its task's inputs are (seeds/signature.py), and a
reference file with no kernel is served by the seed whose kernel passes the real judge on it
(evolve/start/serve.py, issue 58)."""

from __future__ import annotations

import pytest

from evolve.start.serve import candidates
from seeds import load_seed
from seeds.signature import declared, fits
from tests.cli_runs import evolve


@pytest.mark.parametrize("name", [name for name, _ in candidates()])
def test_a_seeds_signature_fits_its_own_inputs_at_its_small_shape_in_its_own_order(name):
    seed = load_seed(name)
    (small, _), = seed.task_class.test_tasks.values()
    task = seed.task(small)
    params = declared(seed.directory / "reference.py")
    workload_names = tuple(i["name"] for i in task._read["inputs"])       # the workload's own names
    assert tuple(p.name for p in params) == workload_names
    assert fits(params, task.input_specs(), workload_names)[0] == tuple(range(len(params)))


def test_eval_of_a_reference_alone_judges_the_seed_that_fits_in_the_order_that_passes(tmp_path):
    from tests.evolve.test_serve import SWAPPED

    ref = tmp_path / "mine.py"
    ref.write_text(SWAPPED)
    r = evolve("eval", "--reference", str(ref), "--chip", "v6e", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "matmul: PASS (a=x, b=w)" in r.stderr and "rmsnorm: no order" in r.stderr
    assert '"status": "PASS"' in r.stdout and '"entry": "matmul"' in r.stdout


# Files under examples/jaxbench/ written apart from the seeds' own references (other names, order
# and expressions): each is served by its seed's kernel, which passes on it.
WRITTEN_APART = [
    ("examples/jaxbench/mamba2_ssd.py", "batch=1,tokens=2048,heads=1,state=128,head=64",
     "mamba2_ssd: PASS (c=C, b=B, x=x, a_log=A_log)", "ssd"),
    ("examples/jaxbench/retnet_retention.py", "batch=1,tokens=2048,heads=1,head_size=64",
     "retnet: PASS (q=queries, k=keys, v=values)", "retention"),
]


@pytest.mark.parametrize("path, shape, served, entry", WRITTEN_APART, ids=["mamba2_ssd", "retnet"])
def test_a_file_written_apart_from_the_seed_is_served_by_it_in_its_own_order(path, shape, served, entry):
    r = evolve("eval", "--reference", path, "--shape", shape, "--chip", "v6e", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert served in r.stderr and "taken" in r.stderr
    assert '"status": "PASS"' in r.stdout and f'"entry": "{entry}"' in r.stdout
