"""`evolve decode-bench` at one small size: every row's figures follow from its latency, the best
chain of an ablation is replayed and timed beside the seed and the XLA reference; bad input is a
one-line error."""

from __future__ import annotations

import json
import pytest

from evolve.experiments.decode_bench import PRICES, best_chain, sized_task
from evolve.errors import UsageError
from seeds import load_seed
from tests.cli_runs import evolve

SHAPE = "B=8,H=8,HKV=8,N=2048,D=128,T=1"


def test_a_small_decode_bench_reports_each_kernel_with_figures_that_follow_from_its_latency(tmp_path):
    ablation = tmp_path / "ablate.json"
    ablation.write_text(json.dumps([
        {"label": "seed", "edits": [], "status": "PASS", "speedup_vs_reference": 1.0},
        {"label": "seed + block_sizes", "status": "PASS", "speedup_vs_reference": 2.0,
         "edits": [{"op": "block_sizes", "params": {"tunable": "BLOCK_KV", "value": 2048}}]},
        {"label": "seed + length_skip", "status": "FAIL_TIMING", "speedup_vs_reference": None,
         "edits": [{"op": "length_skip", "params": {"compute": True}}]}]))
    out = tmp_path / "bench"
    r = evolve("decode-bench", "--shape", SHAPE, "--batches", "2", "--cache-lens", "2048",
               "--ablation", str(ablation), "--out", str(out), "--json", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout)
    four = rows.pop()
    assert [row["label"] for row in rows] == ["XLA reference", "naive seed", "best 1-chip kernel (block_sizes)"]
    price = PRICES["v5e"].usd_per_chip_hour
    # The 4-chip row: checked (interpret mode, 4 CPU devices), timed with the ICI model, and read
    # against the best 1-chip row only (another timing source: no speedup over the reference).
    assert four["status"] == "ok", four["status"]
    assert four["label"].startswith("best 4-chip kernel (") and four["chips"] == 4
    assert four["timing_source"] == "compiler_estimate+hbm+trips+ici_model" and four["speedup_vs_reference"] is None
    assert four["vs_best_1_chip"] == pytest.approx(four["latency_s"] / min(x["latency_s"] for x in rows[1:]))
    assert four["tokens_per_s_per_dollar"] == pytest.approx(four["tokens_per_s"] / (4 * price))
    assert "collectives" in four["plan"] and "us" in four["plan"]
    for row in rows:
        assert row["status"] == "ok" and row["chips"] == 1 and (row["batch"], row["cache_len"]) == (2, 2048)
        assert row["timing_source"] == "compiler_estimate+hbm+trips" and row["libtpu_version"]
        assert row["tokens_per_s"] == pytest.approx(2 / row["latency_s"])
        assert row["tokens_per_s_per_dollar"] == pytest.approx(row["tokens_per_s"] / price)
        assert 0 < row["hbm_util"] <= 1.0
    reference, naive, best = rows
    assert reference["speedup_vs_reference"] == pytest.approx(1.0)
    assert best["latency_s"] < naive["latency_s"]        # 2048-entry blocks move the cache in fewer steps
    assert best["speedup_vs_reference"] == pytest.approx(reference["latency_s"] / best["latency_s"])
    assert (out / "decode-bench.png").stat().st_size > 0 and (out / "decode-bench.md").is_file()
    assert json.loads((out / "decode-bench.json").read_text()) == [*rows, four]


def test_ragged_paged_attention_rows_are_timed_with_their_work_counted_on_data(tmp_path):
    """--rpa adds JAX's ragged paged attention at its tuned blocks at each size (on v6e, where
    libtpu's profile can read its DMAs): its loops and page copies counted on the timing input,
    its HBM use read against its own task's work, no ratio to the decode task's XLA program."""
    from evolve.experiments.decode_bench import rpa_task

    r = evolve("decode-bench", "--chip", "v6e", "--shape", "B=4,H=8,HKV=2,N=2048,D=128,T=1", "--batches", "4",
               "--cache-lens", "2048", "--chips", "1", "--rpa", "--out", str(tmp_path), "--json", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout)
    assert [row["label"] for row in rows] == ["XLA reference", "naive seed",
                                              "JAX ragged_paged_attention (tuned blocks)"]
    rpa = rows[-1]
    assert rpa["status"] == "ok", rpa["status"]
    task = rpa_task(load_seed("flash_decoding").task("B=4,H=8,HKV=2,N=2048,D=128,T=1"))
    assert rpa["task_key"] == task.key and task.prefill == 0 and task.seqs == 4
    assert rpa["timing_source"] == "compiler_estimate+hbm+trips" and rpa["speedup_vs_reference"] is None
    assert rpa["tokens_per_s"] == pytest.approx(4 / rpa["latency_s"])
    assert rpa["tokens_per_s_per_dollar"] == pytest.approx(rpa["tokens_per_s"] / PRICES["v6e"].usd_per_chip_hour)
    assert 0 < rpa["hbm_util"] < 1


@pytest.mark.parametrize("args, message", [
    (["--batches", "0"], "--batches must be positive integers"),
    (["--cache-lens", "8k"], "--cache-lens must be positive integers"),
    (["--cache-lens", "1000"], "cannot be tiled"),
    (["--seed", "flash_attention"], "needs a decode seed"),
    (["--chip", "v9"], "unknown chip"),
    (["--price", "-1"], "--price must be a positive number"),
    (["--chips", "2"], "--chips must be 1 or 1,4"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    r = evolve("decode-bench", *args, "--out", str(tmp_path / "b"), timeout=120)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_ablation_file_without_a_kernel_of_the_operators_is_refused(tmp_path):
    bad = tmp_path / "a.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="cannot read"):
        best_chain(bad)
    bad.write_text(json.dumps([{"label": "seed", "edits": [], "status": "PASS", "speedup_vs_reference": 1.0}]))
    with pytest.raises(UsageError, match="no passing kernel"):
        best_chain(bad)


def test_sizes_are_tasks_of_the_seed():
    base = load_seed("flash_decoding").task(SHAPE)
    task = sized_task(base, 32, 131072)
    assert (task.batch, task.kv_len, task.heads, task.head_dim) == (32, 131072, 8, 128)
    assert task.bytes_moved > base.bytes_moved
