"""JAX's own Pallas TPU kernels as a corpus for the operators: does each operator apply to each
kernel module of the installed JAX, and does the module it writes still import?

The sources are read from the installed package when asked for (nothing of JAX's is copied into
this repository). Each module is paired with the seed whose task fits it best (decode attention
for the paged kernels, flash attention for the rest); an operator's preconditions are checked
against that seed's default task. ``tests/mutations/test_corpus.py`` holds every pair to
"applies and imports, or says why not"; ``scripts/corpus_table.py`` prints the table.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pkgutil
import random
import sys
from pathlib import Path

PACKAGE = "jax.experimental.pallas.ops.tpu"
# The kernels issue 26 names, each with the seed whose task fits it best (JAX's matmul: our matmul seed,
# megablox: our grouped matmul; each a reference file).
NAMED = {
    "flash_attention": "flash_attention",
    "splash_attention.splash_attention_kernel": "flash_attention",
    "paged_attention.paged_attention_kernel": "flash_decoding",
    "ragged_paged_attention.kernel": "ragged_paged_attention",
    "megablox.gmm": "grouped_matmul",
    "matmul": "matmul",
}
OTHER_SEED = "flash_attention"     # for any other kernel module the package holds


@dataclasses.dataclass(frozen=True)
class KernelModule:
    """One kernel module of the installed package: its short name (relative to PACKAGE), source
    and the seed whose task judges operators on it."""

    short: str
    path: str
    source: str = dataclasses.field(repr=False)
    seed: str
    prefix: str = PACKAGE       # the package the short name is relative to

    @property
    def name(self) -> str:
        return f"{self.prefix}.{self.short}"

    @property
    def package(self) -> str:
        return self.name.rpartition(".")[0]


@dataclasses.dataclass(frozen=True)
class Cell:
    """One operator on one module: ``applies`` (and the result imports), or why not."""

    operator: str
    module: str
    status: str        # "applies", "not_applicable", "failed" (the operator's own verdict) or "broken"
    reason: str = ""


def kernel_modules() -> list[KernelModule]:
    """The named kernel modules, then every other module of the package that calls pallas_call,
    by name. A named module the installed JAX lacks is left out (the caller checks)."""
    found: dict[str, Path] = {}
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.submodule_search_locations is None:
        return []
    for info in pkgutil.walk_packages(spec.submodule_search_locations, prefix=f"{PACKAGE}."):
        if info.ispkg:
            continue
        module_spec = importlib.util.find_spec(info.name)
        if module_spec is not None and module_spec.origin and module_spec.origin.endswith(".py"):
            found[info.name.removeprefix(f"{PACKAGE}.")] = Path(module_spec.origin)
    out = [KernelModule(short, str(found[short]), found[short].read_text(), seed)
           for short, seed in NAMED.items() if short in found]
    for short in sorted(set(found) - set(NAMED)):
        source = found[short].read_text()
        if "pallas_call" in source:
            out.append(KernelModule(short, str(found[short]), source, OTHER_SEED))
    return out


def seed_modules(names: list[str]) -> list[KernelModule]:
    """Our own seeds' kernels (``seeds/<name>/kernel.py``), each with its own seed's task: the
    table of which operators reach the kernels we wrote for the JAXBench workloads (issue 58)."""
    root = Path(__file__).resolve().parents[1] / "seeds"
    return [KernelModule(f"{name}.kernel", str(root / name / "kernel.py"), (root / name / "kernel.py").read_text(),
                         name, prefix="seeds") for name in names]


def import_source(source: str, module: KernelModule) -> None:
    """Execute ``source`` as a real module standing in for ``module``: registered in sys.modules
    under a scratch name (dataclasses look their module up there), with the module's package as
    ``__package__`` (relative imports). Raises whatever the source raises; removes it afterwards, and
    the PRNGs it registered (so the next scratch import of the same module may register them again)."""
    from jax._src.random import prng

    scratch = f"_pallas_evolve_corpus_{module.name.replace('.', '_')}"
    mod = type(sys)(scratch)
    mod.__file__ = module.path
    mod.__package__ = module.package
    sys.modules[scratch] = mod
    registered = dict(prng.prngs)       # random.philox registers its PRNG at import: once per process
    try:
        exec(compile(source, module.path, "exec"), mod.__dict__)  # noqa: S102 - the installed JAX's own code
    finally:
        sys.modules.pop(scratch, None)
        prng.prngs.clear()
        prng.prngs.update(registered)


def run_cell(op, module: KernelModule, task) -> Cell:
    """``op`` on ``module`` for ``task`` with ``random.Random(0)``; never raises."""
    result = op.apply(module.source, task, random.Random(0))
    if result.status != "applied":
        return Cell(op.name, module.short, result.status, result.reason)
    try:
        import_source(result.source, module)
    except Exception as exc:  # noqa: BLE001 - a rewrite that does not import is the finding
        return Cell(op.name, module.short, "broken", f"the rewritten module does not import: "
                                                     f"{type(exc).__name__}: {exc}")
    return Cell(op.name, module.short, "applies")


def run_corpus(modules: list[KernelModule] | None = None) -> list[Cell]:
    """Every registered operator on every module, operators in registry order, modules in
    :func:`kernel_modules`' order."""
    from mutations import all_operators
    from seeds import load_seed

    modules = kernel_modules() if modules is None else modules
    tasks = {name: load_seed(name).default_task() for name in sorted({m.seed for m in modules})}
    return [run_cell(op, m, tasks[m.seed]) for op in all_operators() for m in modules]


def format_corpus(cells: list[Cell], modules: list[KernelModule], width: int = 90) -> str:
    """The table as Markdown: an operator per row, a module per column; a cell is ``applies`` or a
    numbered reason, listed under the table (shortened to ``width`` characters; numbered in the
    order they first appear, row by row, so the same cells print the same text)."""
    by_pair = {(c.operator, c.module): c for c in cells}
    operators = list(dict.fromkeys(c.operator for c in cells))
    reasons: dict[str, int] = {}
    lines = ["| operator | " + " | ".join(f"`{m.short}`" for m in modules) + " |",
             "|---|" + "---|" * len(modules)]
    for op in operators:
        row = []
        for m in modules:
            cell = by_pair[(op, m.short)]
            if cell.status == "applies":
                row.append("applies")
                continue
            text = " ".join(f"{'' if cell.status == 'not_applicable' else cell.status + ': '}{cell.reason}".split())
            text = text if len(text) <= width else text[:width - 3].rstrip() + "..."
            number = reasons.setdefault(text, len(reasons) + 1)
            row.append(f"no ({number})")
        lines.append(f"| {op} | " + " | ".join(row) + " |")
    lines.append("")
    lines += [f"{n}. {text.replace('|', '/')}" for text, n in reasons.items()]
    return "\n".join(lines)
