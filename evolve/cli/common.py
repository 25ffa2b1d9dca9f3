"""What every `evolve` command shares: the command class, the shared parent parsers and JSON output.

A command is a small class: its ``name`` and ``help``, the shared options it takes (``parents``:
``"data_dir"`` for ``--data-dir``, ``"format"`` for ``--format {table,json}``), its own
options (``add_arguments``) and what it does (``take_action(args)``, the exit status). Each
``evolve/cli/*.py`` module lists its commands in ``COMMANDS``; ``evolve/cli/__init__.py`` makes the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any, ClassVar

FORMATS = ("table", "json")


class Command:
    """One subcommand of `evolve`."""

    name: ClassVar[str]
    help: ClassVar[str]
    description: ClassVar[str | None] = None     # the command's --help text (default: help)
    parents: ClassVar[tuple[str, ...]] = ()      # shared options: "data_dir", "format", "start", ...

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the command's own arguments (the shared ones come from ``parents``)."""

    def take_action(self, args: argparse.Namespace) -> int:
        """Do it; return the exit status. Bad input raises evolve.errors.UsageError (exit 2)."""
        raise NotImplementedError


def _data_dir(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a directory")
    return text


def data_dir_parser() -> argparse.ArgumentParser:
    """``--data-dir``, for every command that reads or writes the data directory. Its default is
    archive.DEFAULT_DATA_DIR (./evolve_data, or $PALLAS_EVOLVE_DATA_DIR), read when the parser is
    built."""
    import archive

    default = archive.DEFAULT_DATA_DIR
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--data-dir", type=_data_dir, default=default, metavar="DIR",
                        help=f"where runs are stored (default {str(default).replace('%', '%%')}; "
                             "the environment variable PALLAS_EVOLVE_DATA_DIR sets it)")
    return parser


def format_parser() -> argparse.ArgumentParser:
    """``--format {table,json}``: a table for people, or one JSON document on stdout for scripts."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--format", choices=FORMATS, default="table",
                        help="table (default) or json: one JSON document on stdout")
    return parser


def task_parser() -> argparse.ArgumentParser:
    """The task flags, declared once for every command that takes a task. None is "not given": the
    command's default (flash_attention on v5e), or for run and bench the run's configuration."""
    from evaluator import CHIPS

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--seed", default=None,
                        help="a seed's name (evolve seeds) or a seed directory (default flash_attention)")
    parser.add_argument("--chip", default=None, help=f"target chip: {', '.join(CHIPS)} (default: the seed's own; v5e, "
                                                          "v6e for ragged_paged_attention)")
    parser.add_argument("--shape", default=None, help="problem shape in the seed's grammar, e.g. "
                                                      "B=1,H=8,N=2048,D=128 (default: the seed's)")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None,
                        help="attention seeds: causal (default) or full attention (--no-causal)")
    parser.add_argument("--dtype", default=None, help="bfloat16 (the seeds' default), float16 or float32")
    parser.add_argument("--chips", type=int, default=None,
                        help="the task's mesh: 1 (default) or, for seeds that offer one (flash_decoding), 4 "
                             "(a v5e 2x2; a kernel that sets CHIPS = 4 is the per-chip program)")
    parser.add_argument("--reference", default=None, metavar="R.py",
                        help="a reference file as the task instead of a seed: create_inputs() (example arrays) "
                             "and workload(*inputs) (plain JAX); the kernel is the command's FILE or --start")
    parser.add_argument("--entry", default=None, metavar="NAME",
                        help="with --reference: the kernel's entry function (default: its one public "
                             "function that calls pallas_call and takes the workload's inputs)")
    return parser


def one_task(args: argparse.Namespace) -> str | None:
    """``--reference`` (None if not given); a UsageError if ``--seed`` names a task beside it."""
    from evolve.errors import UsageError

    reference = getattr(args, "reference", None)
    if reference and getattr(args, "seed", None):
        raise UsageError(f"--seed {args.seed} and --reference {reference} both name the task; give one")
    return reference


def seed_timing(seed) -> str | None:
    """The timing source a seed's tasks are judged by where no ``--timing`` is given (None: the
    default, auto): its Task's ``timing`` (seeds/_contract.py; a reference file's ``TIMING = "..."``,
    as grouped_matmul's: XLA's ragged_dot has a compiler estimate only with VMEM memory-space
    assignment off)."""
    return getattr(seed.task_class, "timing", None)


def timing_parser() -> argparse.ArgumentParser:
    """``--timing``: every registered timing source, or auto."""
    from evaluator import timing_choices

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--timing", default=None, choices=timing_choices(),
                        help="auto (the default: measured on a TPU host, else compiler_estimate; a seed whose "
                             "task needs its own source names it, e.g. grouped_matmul) or a timing source")
    parser.add_argument("--memory", type=int, default=None, metavar="GIB",
                        help="address space of each judged child in GiB (default: the seed's own, a reference "
                             "file's MEMORY, else 12); a real shape's compile may need more (an 8192-cube "
                             "matmul's profile peaks at 13 GB)")
    return parser


def executor_parser() -> argparse.ArgumentParser:
    """Where and how many at once: ``--workers``, ``--executor`` and each executor's own options."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--workers", type=int, default=None, help="parallel judges (default: one per core)")
    add_executor_arguments(parser)
    return parser


def start_parser() -> argparse.ArgumentParser:
    """``--start``: the kernel to start from instead of the seed's own (evolve/start/resolve.py)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--start", default=None, metavar="MODULE_OR_FILE",
                        help="start from this kernel instead of the seed's kernel.py: a short name the seed "
                             "declares ('evolve seeds', e.g. jax), an importable module (its source is read "
                             "from the installed package, e.g. jax.experimental.pallas.ops.tpu.flash_attention), "
                             "a built-in seed's name (its kernel.py), a seed directory or a file; with --reference, "
                             "a seed's kernel of fewer inputs is grafted into the workload (matmul under a bias "
                             "and gelu); auto (the default for a reference file with no kernel): every built-in "
                             "seed whose SIGNATURE its inputs fit is judged on it, the best that passes taken")
    return parser


PARENT_PARSERS = {"data_dir": data_dir_parser, "format": format_parser, "task": task_parser,
                  "timing": timing_parser, "executor": executor_parser, "start": start_parser}


def shared_parents() -> dict[str, argparse.ArgumentParser]:
    """One parent parser of each kind, shared by every command that asks for it."""
    return {name: make() for name, make in PARENT_PARSERS.items()}


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    """``--executor`` (every registered executor, evolve/executors/base.py) and each executor's own options."""
    from evolve.executors.base import EXECUTORS

    parser.add_argument("--executor", choices=EXECUTORS.names(), default=None,
                        help="where candidates are judged: local (this machine, the default), ray (a Ray "
                             "cluster; needs the extra: pip install 'pallas-evolve[ray]'), or any installed one")
    for name in EXECUTORS.names():
        EXECUTORS.load(name).add_arguments(parser)


def add_json_alias(parser: argparse.ArgumentParser, help: str = "the same as --format json") -> None:
    parser.add_argument("--json", dest="format", action="store_const", const="json", help=help)


def add_command(subparsers, command: type[Command],
                parents: dict[str, argparse.ArgumentParser] | None = None) -> argparse.ArgumentParser:
    """Add one command to an argparse subparsers object; ``args.func`` is its take_action."""
    parents = parents if parents is not None else shared_parents()
    unknown = set(command.parents) - set(parents)
    if unknown:
        raise ValueError(f"command {command.name!r} asks for unknown parent parsers {sorted(unknown)}")
    instance = command()
    parser = subparsers.add_parser(command.name, help=command.help,
                                   description=command.description or command.help,
                                   parents=[parents[p] for p in command.parents])
    instance.add_arguments(parser)
    parser.set_defaults(func=instance.take_action)
    return parser


def jsonable(value: Any) -> Any:
    """Plain JSON values: NaN, pandas' NA and missing values become null, times ISO 8601 text,
    numpy scalars and arrays numbers and lists."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if _is_missing(value):
        return None
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    tolist = getattr(value, "tolist", None)          # numpy arrays and scalars
    if callable(tolist):
        return jsonable(tolist())
    return str(value)


def _is_missing(value: Any) -> bool:
    pd = sys.modules.get("pandas")      # a pandas value means pandas is loaded already
    return pd is not None and (value is pd.NaT or value is pd.NA)


def print_json(document: Any, indent: int | None = 1) -> None:
    """One JSON document on stdout (strict: no NaN)."""
    sys.stdout.write(json.dumps(jsonable(document), indent=indent, allow_nan=False) + "\n")


def evolve_command(argv0: str | None = None) -> str:
    """How the user who ran this process runs ``evolve`` from where they stand, for the hints a
    command prints: ``evolve`` when that is what their PATH finds, else the script's path (as
    ``.venv/bin/evolve`` after ``bash scripts/evolve.sh``), else ``python -m evolve``."""
    script = Path(argv0 if argv0 is not None else sys.argv[0])
    if script.name == "evolve":
        found = shutil.which("evolve")
        if found and Path(found).resolve() == script.resolve():
            return "evolve"
        try:
            relative = os.path.relpath(script.resolve().parent, Path.cwd())
        except ValueError:          # another drive
            relative = str(script.resolve().parent)
        return str(Path(relative) / "evolve") if not relative.startswith("..") else str(script.resolve())
    python = Path(sys.executable)
    return f"{python if python.is_absolute() else python.resolve()} -m evolve"
