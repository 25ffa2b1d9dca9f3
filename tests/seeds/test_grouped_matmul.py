"""The grouped matmul seed (seeds/grouped_matmul): its kernel is judged correct on secret group sizes,
and a kernel that assumes the sizes (even split, or the example's) is caught by the draws."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "seeds" / "grouped_matmul"
SMALL = "M=256,K=256,N=256,E=4"


def evolve(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evolve", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def _eval(tmp_path: Path, source: str) -> dict:
    (tmp_path / "k.py").write_text(source)
    r = evolve("eval", "k.py", "--seed", "grouped_matmul", "--shape", SMALL, "--json", cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_the_seed_passes_on_secret_group_sizes(tmp_path):
    out = _eval(tmp_path, (SEED / "kernel.py").read_text())
    assert out["status"] == "PASS", out["error"]
    assert out["estimated_cycles"] and out["estimated_cycles"] > 0


def test_a_kernel_that_assumes_an_even_split_fails(tmp_path):
    even = (SEED / "kernel.py").read_text().replace("size = sizes_ref[g]", "size = m // sizes_ref.shape[0]")
    assert even != (SEED / "kernel.py").read_text()
    out = _eval(tmp_path, even)
    assert out["status"] == "FAIL_CORRECTNESS", out


def test_the_visits_cover_every_row_once_for_any_sizes():
    """The seed's visit plan, walked in numpy as its index maps walk it: every row of every group
    is kept by exactly one visit, on its own group's weights, for skewed and empty groups; a tile's
    visits are consecutive and only its first resets the accumulator."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gmm_seed", SEED / "kernel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rng = np.random.default_rng(0)
    for m, bm, e in [(256, 128, 4), (512, 128, 8), (512, 512, 8), (384, 128, 3)]:
        for _ in range(20):
            sizes = rng.multinomial(m, rng.dirichlet(np.full(e, 0.3)))
            owner = np.repeat(np.arange(e), sizes)
            kept = np.zeros(m, int)
            tiles, fresh = [], []
            for v in range(m // bm + e - 1):
                group, tile, lo, hi = (int(x) for x in module._locate(sizes, v, bm, m))
                tiles.append(tile)
                fresh.append(lo <= tile * bm)
                rows = np.arange(tile * bm, tile * bm + bm)
                keep = rows[(rows >= lo) & (rows < hi)]
                assert (owner[keep] == group).all()
                kept[keep] += 1
            assert (kept == 1).all(), (sizes, kept)
            assert tiles == sorted(tiles) and sorted(set(tiles)) == list(range(m // bm))
            assert fresh == [v == 0 or tiles[v] != tiles[v - 1] for v in range(len(tiles))], (sizes, tiles)
