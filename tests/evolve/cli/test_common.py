"""What the `evolve` commands share: the one --data-dir (its default from archive.DEFAULT_DATA_DIR,
i.e. $PALLAS_EVOLVE_DATA_DIR), --format {table,json}, and JSON a script can parse, on a real data
directory written through the archive (no kernel is compiled: the verdicts are made up)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from archive import Archive, individual_id, make_row
from evaluator.result import EvalResult, Metrics, Provenance, Status
from evolve.cli import build_parser, execute

ROOT = Path(__file__).resolve().parents[3]
DATA_COMMANDS = {"run", "resume", "status", "lineage", "sync", "ui", "promote", "bench"}
# The positional arguments each command needs to parse.
POSITIONALS = {"resume": ["r"], "lineage": ["abc"], "sync": ["r"], "promote": ["r"], "eval": ["k.py"],
               "mutate": ["k.py", "--op", "x"]}
T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
SEED, CHILD, CHAMPION, BROKEN = ("x = 0\n", "x = 1\n", "x = 2\n", "x = (\n")


def _result(speedup: float | None, cycles: int | None) -> EvalResult:
    prov = Provenance(timing_source="compiler_estimate+hbm+trips", chip="v5e", libtpu_version="0.0.1",
                      jax_version="0.1")
    if speedup is None:
        return EvalResult(Status.CRASH, error="boom", provenance=prov)
    return EvalResult(Status.PASS, metrics=Metrics(latency_s=1e-4 / speedup, speedup_vs_reference=speedup,
                                                   estimated_cycles=cycles, sandbox_time_s=1.0,
                                                   compile_time_s=2.0),
                      provenance=prov, wall_time_s=4.0)


def _row(run_id, source, result, generation, parents=(), op="seed", params=None, minutes=0):
    return make_row(run_id=run_id, source=source, result=result, task_key="attn-test", generation=generation,
                    parent_ids=[individual_id(p) for p in parents], operator=op, params=params,
                    evaluated_at=T0 + dt.timedelta(minutes=minutes))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Run r1: seed -> causal_skip -> block_sizes(BLOCK_KV=256), the champion, plus a crash in
    generation 1; run r0: one crash only (its best speedup is missing: NaN in pandas)."""
    path = tmp_path_factory.mktemp("cli") / "data"
    archive = Archive(path)
    archive.append([_row("r1", SEED, _result(1.0, 1000), 0)])
    archive.append([_row("r1", CHILD, _result(1.5, 700), 1, [SEED], "causal_skip", minutes=1),
                    _row("r1", BROKEN, _result(None, None), 1, [SEED], "exp2_softmax", minutes=1)])
    archive.append([_row("r1", CHAMPION, _result(2.0, 500), 2, [CHILD], "block_sizes",
                         {"tunable": "BLOCK_KV", "value": 256}, minutes=2)])
    archive.write_run_meta("r1", {"config": {"judge": {"workers": 2}}, "task_key": "attn-test",
                                  "status": "finished", "champion_id": individual_id(CHAMPION), "strategy": "ga",
                                  "chip": "v5e", "timing_source": "compiler_estimate+hbm+trips"})
    archive.append([_row("r0", BROKEN, _result(None, None), 0)])
    archive.write_run_meta("r0", {"config": {}, "task_key": "attn-test", "status": "finished"})
    return path


def evolve_in_process(argv: list[str], capsys) -> tuple[int, str, str]:
    code = execute(build_parser().parse_args(argv))
    out, err = capsys.readouterr()
    return code, out, err


def strict_json(text: str):
    """One JSON document, with none of Python's NaN / Infinity extensions."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _subparsers(parser):
    return next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices


# ---- --data-dir: one option, on every command that uses the data directory ----------------------
def test_data_dir_is_one_shared_option_on_exactly_the_commands_that_use_the_data_directory():
    commands = _subparsers(build_parser())
    with_data_dir = {name for name, p in commands.items()
                     if any("--data-dir" in a.option_strings for a in p._actions)}
    assert with_data_dir == DATA_COMMANDS
    actions = {id(next(a for a in commands[name]._actions if "--data-dir" in a.option_strings))
               for name in DATA_COMMANDS}
    assert len(actions) == 1             # the same argparse action: declared once, in one parent parser


def test_data_dir_defaults_to_the_archives_default(monkeypatch, tmp_path):
    import archive

    monkeypatch.setattr(archive, "DEFAULT_DATA_DIR", tmp_path / "from-archive")
    parser = build_parser()
    for name in sorted(DATA_COMMANDS):
        args = parser.parse_args([name, *POSITIONALS.get(name, [])])
        assert args.data_dir == tmp_path / "from-archive", name
        assert parser.parse_args([name, *POSITIONALS.get(name, []), "--data-dir", "elsewhere"]).data_dir \
            == "elsewhere"


def test_pallas_evolve_data_dir_is_read_when_no_data_dir_is_given(data, tmp_path):
    """A fresh process, in a directory with no ./evolve_data: the environment variable decides."""
    env = dict(os.environ, PALLAS_EVOLVE_DATA_DIR=str(data), PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "evolve", "status", "--format", "json"], capture_output=True,
                       text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [run["run_id"] for run in strict_json(r.stdout)] == ["r0", "r1"]
    assert not (tmp_path / "evolve_data").exists()
    env["PALLAS_EVOLVE_DATA_DIR"] = str(tmp_path / "nowhere")
    r = subprocess.run([sys.executable, "-m", "evolve", "status"], capture_output=True, text=True, cwd=tmp_path,
                       env=env, timeout=300)
    assert r.returncode == 2 and str(tmp_path / "nowhere") in r.stderr and len(r.stderr.splitlines()) == 1


# ---- --format json ----------------------------------------------------------------------------
def test_status_json_lists_the_runs(data, capsys):
    code, out, _ = evolve_in_process(["status", "--format", "json", "--data-dir", str(data)], capsys)
    assert code == 0
    runs = {run["run_id"]: run for run in strict_json(out)}
    assert set(runs) == {"r0", "r1"}
    assert runs["r1"]["evaluations"] == 4 and runs["r1"]["passed"] == 3 and runs["r1"]["best_speedup"] == 2.0
    assert runs["r1"]["status"] == "finished" and runs["r1"]["first_evaluated_at"].startswith("2025-01-01T00:00")
    assert runs["r0"]["best_speedup"] is None                       # NaN in pandas, null in JSON


def test_status_json_of_a_run_has_its_generations_and_champion(data, capsys):
    code, out, _ = evolve_in_process(["status", "r1", "--format", "json", "--data-dir", str(data)], capsys)
    assert code == 0
    doc = strict_json(out)
    assert doc["run_id"] == "r1" and doc["status"] == "finished"
    assert doc["timing_sources"] == ["compiler_estimate+hbm+trips"]
    assert [(g["generation"], g["evaluations"], g["passed"], g["best_speedup"]) for g in doc["generations"]] == \
        [(0, 1, 1, 1.0), (1, 2, 1, 1.5), (2, 1, 1, 2.0)]
    champion = doc["champion"]
    assert champion["individual_id"] == individual_id(CHAMPION) and champion["speedup_vs_reference"] == 2.0
    assert champion["estimated_cycles"] == 500
    assert champion["edits"] == ["causal_skip", "block_sizes(tunable=BLOCK_KV, value=256)"]
    assert doc["stage_seconds"]["compile"] == pytest.approx(6.0)
    assert "individuals" not in doc
    code, out, _ = evolve_in_process(["status", "r1", "--ids", "--format", "json", "--data-dir", str(data)], capsys)
    ids = {i["individual_id"] for i in strict_json(out)["individuals"]}
    assert ids == {individual_id(s) for s in (SEED, CHILD, CHAMPION, BROKEN)}


def test_status_table_is_unchanged_by_the_json_option(data, capsys):
    code, out, _ = evolve_in_process(["status", "r1", "--data-dir", str(data)], capsys)
    assert code == 0 and "best_speedup" in out and f"champion: {individual_id(CHAMPION)}" in out
    assert "2.000x the XLA reference, 500 estimated cycles" in out and "seed -> causal_skip -> block_sizes" in out
    assert "kernels judged per minute" in out
    assert "outside the runner's own stages (worker + runner start + judge): " in out


def test_lineage_json_is_the_chain_of_edits_and_draws_nothing_unasked(data, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, out, _ = evolve_in_process(["lineage", individual_id(CHAMPION)[:6], "--format", "json",
                                      "--data-dir", str(data)], capsys)
    assert code == 0
    doc = strict_json(out)
    assert doc["individual_id"] == individual_id(CHAMPION) and doc["run_id"] == "r1" and doc["picture"] is None
    chain = doc["chain"]
    assert [s["individual_id"] for s in chain] == [individual_id(s) for s in (SEED, CHILD, CHAMPION)]
    assert [s["edit"] for s in chain] == ["seed", "causal_skip", "block_sizes(tunable=BLOCK_KV, value=256)"]
    assert [s["status"] for s in chain] == ["PASS"] * 3
    assert [s["estimated_cycles"] for s in chain] == [1000, 700, 500]
    assert [s["speedup_vs_reference"] for s in chain] == [1.0, 1.5, 2.0]
    assert chain[0]["speedup_over_parent"] is None and chain[2]["speedup_over_parent"] == pytest.approx(2.0 / 1.5)
    assert {s["timing_source"] for s in chain} == {"compiler_estimate+hbm+trips"}
    assert chain[2]["params"] == {"tunable": "BLOCK_KV", "value": 256}
    assert list(tmp_path.iterdir()) == []                   # no picture unless --out
    svg = tmp_path / "l.svg"
    code, out, _ = evolve_in_process(["lineage", individual_id(CHAMPION), "--format", "json", "--out", str(svg),
                                      "--data-dir", str(data)], capsys)
    assert code == 0 and strict_json(out)["picture"] == str(svg) and svg.read_text().startswith("<svg")


def test_lineage_json_of_a_failed_individual(data, capsys):
    code, out, _ = evolve_in_process(["lineage", individual_id(BROKEN), "--format", "json",
                                      "--data-dir", str(data)], capsys)
    assert code == 0
    last = strict_json(out)["chain"][-1]
    assert last["status"] == "CRASH" and last["speedup_vs_reference"] is None and last["estimated_cycles"] is None


def test_lineage_table_still_prints_the_chain_and_a_picture(data, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, out, _ = evolve_in_process(["lineage", individual_id(CHAMPION), "--data-dir", str(data)], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"{individual_id(SEED)}  g0  seed") and "1.000x vs reference" in lines[0]
    assert "(1.33x over its parent)" in lines[2] and lines[-1] == f"picture: lineage-{individual_id(CHAMPION)}.svg"
    assert (tmp_path / f"lineage-{individual_id(CHAMPION)}.svg").exists()


@pytest.mark.parametrize("argv, fmt", [
    (["status"], "table"), (["status", "--format", "json"], "json"), (["lineage", "x", "--format", "table"], "table"),
    (["ablate"], "table"), (["ablate", "--json"], "json"), (["ablate", "--format", "json"], "json"),
    (["eval", "k.py", "--json"], "json"), (["eval", "k.py"], "table"),
    (["status", "--json"], "json"), (["status", "r1", "--json"], "json"), (["lineage", "x", "--json"], "json"),
])
def test_format_and_its_json_alias(argv, fmt):
    assert build_parser().parse_args(argv).format == fmt


def test_every_command_with_format_takes_its_json_alias():
    """docs/commands.md: `--json` is short for `--format json`, on every command that has it."""
    commands = _subparsers(build_parser())
    with_format = {name for name, p in commands.items() if any("--format" in a.option_strings for a in p._actions)}
    with_json = {name for name, p in commands.items() if any("--json" in a.option_strings for a in p._actions)}
    assert with_format and with_format == with_json


def test_status_json_alias_prints_what_the_table_does(data, capsys):
    """`evolve status RUN --json` (refused before issue 57): the generations, the champion, the
    seconds per stage and the judged kernels by status, as the table prints them."""
    code, out, err = evolve_in_process(["status", "r1", "--json", "--data-dir", str(data)], capsys)
    assert code == 0, err
    doc = strict_json(out)
    assert doc["champion"]["individual_id"] == individual_id(CHAMPION) and len(doc["generations"]) == 3
    assert doc["judged"] == 4 and doc["by_status"] == {"CRASH": 1, "PASS": 3} and doc["no_pass"] is None
    assert doc["stage_seconds"]["compile"] == pytest.approx(6.0)
    code, out, _ = evolve_in_process(["status", "r1", "--data-dir", str(data)], capsys)
    assert "judged kernels by status: CRASH 1, PASS 3" in out


# ---- bad input: one line, exit status 2 ---------------------------------------------------------
@pytest.mark.parametrize("argv, fragment", [
    (["status", "--format", "yaml"], "invalid choice: 'yaml'"),
    (["lineage", "x", "--format", "csv"], "invalid choice: 'csv'"),
    (["status", "--data-dir", ""], "argument --data-dir: is empty"),
    (["run", "--data-dir", " "], "argument --data-dir: is empty"),
])
def test_bad_options_are_one_line_exit_2(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, err


@pytest.mark.parametrize("argv, fragment", [
    (["status", "--ids"], "give the run"),
    (["status", "no-such-run", "--format", "json"], "no run 'no-such-run'"),
    (["lineage", "ffffffffffff", "--format", "json"], "no individual"),
])
def test_bad_input_in_json_mode_is_one_line_on_stderr_and_nothing_on_stdout(data, argv, fragment, capsys):
    code, out, err = evolve_in_process([*argv, "--data-dir", str(data)], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and fragment in err, err


def test_hints_name_the_evolve_a_user_can_run_from_where_they_stand(tmp_path, monkeypatch):
    """After `bash scripts/evolve.sh` a new user has no `evolve` on their PATH: the closing hints
    say `.venv/bin/evolve`; where PATH finds the same script they say `evolve`; run as a module
    from elsewhere, the interpreter's `-m evolve`."""
    from evolve.cli.common import evolve_command

    script = tmp_path / ".venv" / "bin" / "evolve"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert evolve_command(".venv/bin/evolve") == ".venv/bin/evolve"
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    assert evolve_command(".venv/bin/evolve") == "evolve"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert evolve_command(str(script)) == str(script.resolve())
    assert evolve_command("/somewhere/evolve/__main__.py").endswith(" -m evolve")
