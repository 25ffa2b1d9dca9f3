"""Every registered operator on every Pallas TPU kernel module of the installed JAX, as Markdown.

    .venv/bin/python scripts/corpus_table.py              # JAX's modules
    .venv/bin/python scripts/corpus_table.py --seeds      # our kernels for the JAXBench workloads

A cell is ``applies`` (the operator rewrites the module and the result still imports) or a
numbered reason why not, listed under the table. The modules' sources are read from the installed
jax at run time (mutations/corpus.py); the output is deterministic for one jax and one set of
operators, so the README's table is re-made by running this again. Exit status 1 when a cell is
neither (an operator failed, or wrote a module that does not import).
"""

from __future__ import annotations

import importlib.metadata
import sys

from mutations.corpus import NAMED, PACKAGE, format_corpus, kernel_modules, run_corpus, seed_modules

# Our seeds written for vanilla-JAX workloads (issue 58): their own task judges each operator.
JAXBENCH_SEEDS = ["retnet", "mamba2_ssd", "mla", "sparse_moe"]


def seeds_table() -> int:
    modules = seed_modules(JAXBENCH_SEEDS)
    cells = run_corpus(modules)
    print("Our kernels for the JAXBench workloads (`seeds/<name>/kernel.py`), each checked against its own "
          "seed's default task.\n")
    print(format_corpus(cells, modules))
    return 1 if any(c.status not in ("applies", "not_applicable") for c in cells) else 0


def main() -> int:
    if sys.argv[1:] == ["--seeds"]:
        return seeds_table()
    if sys.argv[1:]:
        print(f"usage: {sys.argv[0]} [--seeds]", file=sys.stderr)
        return 2
    modules = kernel_modules()
    missing = sorted(set(NAMED) - {m.short for m in modules})
    cells = run_corpus(modules)
    by_seed: dict[str, list[str]] = {}
    for m in modules:
        by_seed.setdefault(m.seed, []).append(f"`{m.short}`")
    tasks = "; ".join(f"{seed}'s default task: {', '.join(names)}" for seed, names in by_seed.items())
    print(f"The modules of `{PACKAGE}` that call `pallas_call`, in jax {importlib.metadata.version('jax')}; "
          f"each checked against the seed task that fits it best ({tasks}).\n")
    print(format_corpus(cells, modules))
    if missing:
        print(f"\nnot in this jax: {', '.join(missing)}")
    bad = [c for c in cells if c.status not in ("applies", "not_applicable")]
    return 1 if bad or missing else 0


if __name__ == "__main__":
    sys.exit(main())
