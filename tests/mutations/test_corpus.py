"""Every registered operator on every Pallas TPU kernel module of the installed JAX (issue 26).

For each pair the operator either applies and the module it writes still imports (executed as a
real module, registered in sys.modules, with its own package for relative imports), or it says
"not applicable" with a reason. It never raises, never "fails" and never writes a module that
does not import. The sources are read from the installed jax at test time: nothing of JAX's is
committed here, and no golden file is made from it. ``scripts/corpus_table.py`` prints the table.
"""

from __future__ import annotations

import random

import pytest

from mutations import all_operators
from mutations.corpus import NAMED, Cell, KernelModule, format_corpus, import_source, kernel_modules, seed_modules
from seeds import load_seed

pytest.importorskip("jax.experimental.pallas.ops.tpu")

# JAX's modules, then our own kernels for the JAXBench workloads (issue 58), each with its seed's task.
MODULES = kernel_modules() + seed_modules(["retnet", "mamba2_ssd", "mla", "sparse_moe"])
TASKS = {name: load_seed(name).default_task() for name in sorted({m.seed for m in MODULES})}


def test_every_named_kernel_module_is_in_the_installed_jax():
    assert set(NAMED) <= {m.short for m in MODULES}, "a kernel module named by issue 26 moved in this jax"


@pytest.mark.parametrize("module", MODULES, ids=[m.short for m in MODULES])
def test_the_installed_module_imports_as_a_scratch_module(module: KernelModule):
    # The baseline: the import check itself accepts JAX's source unchanged.
    import_source(module.source, module)


@pytest.mark.parametrize("module", MODULES, ids=[m.short for m in MODULES])
def test_every_operator_applies_and_imports_or_says_why_not(module: KernelModule):
    task = TASKS[module.seed]
    for op in all_operators():
        result = op.apply(module.source, task, random.Random(0))     # never raises: its contract
        assert result.status in ("applied", "not_applicable"), f"{op.name} on {module.short}: {result.reason}"
        if result.status == "not_applicable":
            assert result.reason.strip(), f"{op.name} on {module.short} says not applicable without a reason"
            assert result.source == module.source
            continue
        assert result.source != module.source and result.edit is not None and result.edit.op == op.name
        try:
            import_source(result.source, module)
        except Exception as exc:  # noqa: BLE001 - the finding, named
            pytest.fail(f"{op.name} on {module.short} wrote a module that does not import: "
                        f"{type(exc).__name__}: {exc}")


def test_a_seed_kernel_is_named_under_seeds_and_at_least_one_operator_reaches_each():
    # the table of which operators reach our JAXBench kernels must not be empty for any of them
    for module in seed_modules(["retnet", "mamba2_ssd", "mla", "sparse_moe"]):
        assert module.name == f"seeds.{module.seed}.kernel" and module.path.endswith(f"seeds/{module.seed}/kernel.py")
        task = TASKS[module.seed]
        assert any(op.apply(module.source, task, random.Random(0)).status == "applied" for op in all_operators()), \
            module.short


def test_import_check_catches_a_module_that_does_not_import():
    module = MODULES[0]
    with pytest.raises(NameError):
        import_source(module.source + "\nundefined_name_in_the_rewrite\n", module)


def test_the_table_numbers_reasons_in_order_and_shortens_them():
    modules = [KernelModule("a", "/a.py", "", "flash_attention"), KernelModule("b.c", "/b/c.py", "", "flash_attention")]
    cells = [Cell("op1", "a", "applies"), Cell("op1", "b.c", "not_applicable", "reason one"),
             Cell("op2", "a", "not_applicable", "x" * 200), Cell("op2", "b.c", "not_applicable", "reason one")]
    table = format_corpus(cells, modules, width=20)
    assert table == format_corpus(list(cells), modules, width=20)
    lines = table.splitlines()
    assert lines[2] == "| op1 | applies | no (1) |"
    assert lines[3] == "| op2 | no (2) | no (1) |"
    assert lines[-2:] == ["1. reason one", "2. " + "x" * 17 + "..."]
