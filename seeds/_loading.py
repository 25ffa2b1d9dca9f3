"""Loading a seed: a built-in by name (the ``seeds`` family), any other by its directory, a
reference file's directory as its task (``seeds/reference.py``); the task's class rebuilt from its
task.py's text in a trusted child. ``load_seed`` checks the contract and says in one line what breaks it."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path
from typing import Any

from seeds._contract import BUILTIN_DIR, FILES, Seed, SeedError, SeedTask
from seeds.reference import reference_seed
from seeds.registry import Registry


def _builtin_names() -> list[str]:
    return sorted(p.name for p in BUILTIN_DIR.iterdir() if p.is_dir() and not p.name.startswith("_")
                  and ((p / "task.py").is_file() or (p / "reference.py").is_file()))


# A family (seeds/registry.py): name -> a package whose directory is a seed (task.py and kernel.py).
# The built-ins are the directories here; an installed package adds one with an entry point
# ``pallas_evolve.seeds`` (``name = "package.subpackage"``); any other seed is loaded by its path.
SEEDS = Registry("seeds", {name: f"seeds.{name}" for name in _builtin_names()}, member="seed")


def builtin_seeds() -> list[str]:
    """Every seed known by name: the built-ins, then those of installed packages."""
    return SEEDS.names()


def _seed_directory(name: str) -> Path | None:
    """The directory of the seed registered as ``name``, or None."""
    if name not in SEEDS:
        return None
    try:
        module = SEEDS.load(name)
        return Path(module.__file__).resolve().parent
    except Exception as exc:  # noqa: BLE001 - an installed package's failure, in one line
        raise SeedError(f"seed {name!r} (registered by an installed package) cannot be imported: "
                        f"{type(exc).__name__}: {exc}") from None


def task_source(task: SeedTask) -> str:
    """The text of the task.py that defines ``task``'s class: trusted children rebuild it from it."""
    module = sys.modules[type(task).__module__]
    if getattr(module, "__seed_source__", None) is None:    # a built-in, imported: read its file once
        module.__seed_source__ = Path(module.__file__).read_text()
    return module.__seed_source__


def task_from_source(source: str, fields: dict[str, Any]) -> SeedTask:
    """In a trusted child: the task again, from its task.py's text and its fields."""
    return task_class_from_source(source, "pallas_evolve_seed_task")(**fields)


def task_class_from_source(source: str, module_name: str) -> type[SeedTask]:
    """Execute a task.py's text as a module and return its ``Task`` (trusted processes only)."""
    module = type(sys)(module_name)
    module.__file__ = f"<{module_name}>"
    module.__seed_source__ = source
    sys.modules[module_name] = module   # dataclasses look their module up by name
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 - the seed's own trusted file
    return _task_class(module)


def _task_class(module) -> type[SeedTask]:
    cls = getattr(module, "Task", None)
    if not (isinstance(cls, type) and issubclass(cls, SeedTask)):
        raise SeedError("its task.py defines no class Task(SeedTask); see the seed contract in the README")
    return cls


# One class per seed directory and task.py text: loading a seed again does not execute it again.
_PATH_CLASSES: dict[tuple[str, str], type[SeedTask]] = {}


def load_seed(name_or_path: str | Path) -> Seed:
    """A built-in seed by name, or any seed directory by path. SeedError if it breaks the contract."""
    text = str(name_or_path)
    registered = _seed_directory(text) if "/" not in text and text not in (".", "..") else None
    if registered is not None:
        directory = registered
    else:
        directory = Path(text).expanduser()
        if not directory.is_dir():
            raise SeedError(f"unknown seed {text!r}: not a built-in seed ({', '.join(builtin_seeds())}) "
                            "and not a directory; give a built-in name or a seed directory's path")
    where = f"seed directory {directory}"
    if not (directory / "task.py").is_file() and (directory / "reference.py").is_file() \
            and (directory / "kernel.py").is_file():     # a reference file for its task (seeds/reference.py)
        found = reference_seed(directory)
        return dataclasses.replace(found, name=directory.name) if registered is not None else found
    missing = [f for f in FILES if not (directory / f).is_file()]
    if missing:
        raise SeedError(f"{where} has no {' and no '.join(missing)}; a seed directory holds task.py "
                        "(the trusted task) and kernel.py (the starting kernel)")
    resolved = directory.resolve()
    try:
        if resolved.parent == BUILTIN_DIR:   # one class per built-in seed, however reached
            cls = _task_class(importlib.import_module(f"seeds.{directory.name}.task"))
        else:
            key = (str(resolved), (directory / "task.py").read_text())
            if key not in _PATH_CLASSES:
                _PATH_CLASSES[key] = task_class_from_source(key[1], f"pallas_evolve_seed_{abs(hash(key[0]))}")
            cls = _PATH_CLASSES[key]
    except SeedError as exc:
        raise SeedError(f"{where}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's file; say what broke, in one line
        raise SeedError(f"{where}: task.py fails to import: {type(exc).__name__}: {exc}") from None
    for attr in ("name", "entry", "input_names", "shape_grammar"):
        if not getattr(cls, attr):
            raise SeedError(f"{where}: its Task sets no {attr!r}; see the seed contract in the README")
    for method in ("from_options", "key", "input_specs", "make_inputs", "reference", "reference_program",
                   "flops", "bytes_moved", "tolerance"):
        if getattr(cls, method) is getattr(SeedTask, method):
            raise SeedError(f"{where}: its Task does not define {method}; see the seed contract in the README")
    try:
        cls()
    except Exception as exc:  # noqa: BLE001
        raise SeedError(f"{where}: Task() (the default problem) fails: {exc}") from None
    kernel = (directory / "kernel.py").read_text()
    if f"def {cls.entry}" not in kernel and f"{cls.entry} =" not in kernel:
        raise SeedError(f"{where}: kernel.py defines no {cls.entry!r}, the entry point its Task names")
    return Seed(cls.name, resolved, cls)
