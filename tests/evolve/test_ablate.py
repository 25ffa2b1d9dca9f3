"""`evolve ablate --json` on a tiny task: a row per operator (those that need another operator
first on top of it), the grid row of all operators together, JAX's kernels, with provenance."""

from __future__ import annotations

import json

from mutations import operator_names
from tests.evolve.test_run import evolve


def test_ablate_json_has_every_operator_the_grid_and_jax(tmp_path):
    r = evolve("ablate", "--shape", "B=1,H=2,N=256,D=128", "--json", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout)
    labels = [row["label"] for row in rows]
    assert labels[0] == "seed"
    for row in rows:
        assert {"label", "edits", "status", "estimated_cycles", "latency_s", "speedup_vs_reference",
                "timing_source", "chip", "libtpu_version"} <= set(row)
        assert row["timing_source"] == "compiler_estimate" and row["chip"] == "v5e"
    by_op = {row["edits"][-1]["op"]: row for row in rows if row["label"].startswith("seed + ")}
    assert set(by_op) == set(operator_names())
    # diagonal_strips and approx_reciprocal do not apply to the seed: each sits on its prerequisite.
    assert by_op["diagonal_strips"]["label"] == "seed + causal_skip + diagonal_strips"
    assert by_op["approx_reciprocal"]["label"] == "seed + deferred_norm + approx_reciprocal"
    grid = [row for row in rows if row["label"].startswith("all operators together")]
    assert len(grid) == 1 and grid[0]["status"] == "PASS"
    assert {"causal_skip", "deferred_norm", "exp2_softmax"} <= {e["op"] for e in grid[0]["edits"]}
    passed = [row for row in rows if row["status"] == "PASS" and not row["label"].startswith("JAX")]
    assert grid[0]["estimated_cycles"] <= min(row["estimated_cycles"] for row in passed)
    assert {"JAX flash_attention (default blocks)", "JAX flash_attention (tuned blocks)"} <= set(labels)
