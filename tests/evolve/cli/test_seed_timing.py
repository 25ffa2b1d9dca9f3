"""A seed carries the timing source its task needs (issue 57): grouped_matmul's XLA program
(ragged_dot) has a compiler estimate only with VMEM memory-space assignment off, so `eval`, `run`,
`ablate` and the suite judge it by compiler_estimate_no_vmem_msa where no --timing is given. No
kernel is judged here: the choice is the subject."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from evaluator.result import EvalResult, Metrics, Status
from evolve.cli import build_parser, execute
from evolve.cli.common import seed_timing
from seeds import load_seed, reference_seed

ROOT = Path(__file__).resolve().parents[3]
NO_MSA = "compiler_estimate_no_vmem_msa"
GROUPED_SMALL = "M=256,K=256,N=256,E=4"


def test_a_seed_names_its_timing_source_or_none():
    assert seed_timing(load_seed("grouped_matmul")) == NO_MSA
    assert seed_timing(load_seed("matmul")) is None and seed_timing(load_seed("flash_attention")) is None
    # A task.py seed says it with its Task's class attribute (seeds/_contract.py).
    assert seed_timing(SimpleNamespace(task_class=type("Task", (), {"timing": "compiler_estimate"}))) == \
        "compiler_estimate"


def test_a_users_reference_file_may_name_one_too(tmp_path):
    path = tmp_path / "r.py"
    path.write_text('TIMING = "compiler_estimate"\n\ndef create_inputs():\n    return ()\n')
    assert seed_timing(reference_seed(path)) == "compiler_estimate"
    path.write_text("def create_inputs():\n    return ()\n")
    assert seed_timing(reference_seed(path)) is None


@pytest.mark.parametrize("argv, timing", [
    (["run", "--seed", "grouped_matmul"], NO_MSA),
    (["run", "--seed", "grouped_matmul", "--timing", "compiler_estimate"], "compiler_estimate"),
    (["run", "--seed", "grouped_matmul", "--timing", "auto"], "auto"),      # asked for: kept
    (["run", "--seed", "matmul"], "auto"),
    (["run"], "auto"),
])
def test_run_takes_the_seeds_timing_where_the_user_gives_none(argv, timing):
    from evolve.cli.run import _config_from_args

    assert _config_from_args(build_parser().parse_args(argv)).judge.timing == timing


def test_the_suite_reads_it_from_the_seed():
    from evolve.experiments import suite as S

    base = S.default_config().judge
    grouped = S.SuiteTask("g", seed="grouped_matmul", shape="M=512,K=1024,N=2048,E=8")
    assert grouped.timing is None and grouped.judge_settings(base).timing == NO_MSA
    assert S.SuiteTask("m", seed="matmul").judge_settings(base).timing == "auto"
    assert S.SuiteTask("g", seed="grouped_matmul", timing="compiler_estimate").judge_settings(base).timing == \
        "compiler_estimate"


@pytest.mark.parametrize("extra, timing", [([], NO_MSA), (["--timing", "compiler_estimate"], "compiler_estimate")])
def test_eval_judges_by_the_seeds_timing_where_the_user_gives_none(monkeypatch, capsys, extra, timing):
    import evaluator

    made = []

    class Judge:                     # the judge's configuration is the subject, not its verdict
        def __init__(self, config):
            made.append(config)

        def evaluate(self, source, task):
            return EvalResult(Status.PASS, metrics=Metrics(latency_s=1e-6, estimated_cycles=1000))

    monkeypatch.setattr(evaluator, "Judge", Judge, raising=False)
    argv = ["eval", str(ROOT / "seeds/grouped_matmul/kernel.py"), "--seed", "grouped_matmul",
            "--shape", GROUPED_SMALL, *extra]
    assert execute(build_parser().parse_args(argv)) == 0, capsys.readouterr().err
    assert [c.timing for c in made] == [timing]
