"""Where a kernel starts from: the seed's own kernel, an installed module, or a file.

``--start`` names it (every command that takes a kernel: run, eval, mutate, ablate, bench):

* nothing: the seed's own ``kernel.py``;
* a short name the seed declares (its task's ``starts``, e.g. ``jax`` for flash attention);
* a dotted module name (``jax.experimental.pallas.ops.tpu.flash_attention``): found with
  ``importlib.util.find_spec`` and its source read from the installed package at run time
  (nothing is copied into this repository);
* a built-in seed's name that is no importable module (``matmul``): that seed's ``kernel.py``;
* a path: the file (a seed directory: its ``kernel.py``).

With a reference file as the task (``--reference R.py``), a kernel that sits beside a reference
file of its own and takes fewer inputs than R's workload is grafted into it (``evolve/start/graft.py``:
the matmul seed on ``gelu(x @ w + b)``), and its label says so.

The seed's trusted task judges the source, as it judges any file. A :class:`Start` records where
the source came from (module, distribution and version; or path; and the source's sha256) for the
run's record, the archive's ``start`` column, lineage and MLflow. A start that cannot be read is
a one-line UsageError saying how to fix it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import os
import pkgutil
import re
from pathlib import Path
from typing import Any

from evolve.errors import UsageError

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclasses.dataclass(frozen=True)
class Start:
    """A starting kernel's source and where it came from."""

    spec: str                 # as given ("" for the seed's own kernel)
    kind: str                 # "seed", "module" or "file"
    name: str                 # the seed's name, the module's dotted name, or the file's path
    path: str                 # the file the source was read from
    source: str = dataclasses.field(repr=False)
    distribution: str | None = None   # the installed distribution that ships the module
    version: str | None = None
    # Block parameters the source leaves to its caller, given a default for the task (for_task),
    # and the sha256 of the source as read (what a resumed run checks).
    defaults: tuple[tuple[str, Any], ...] = ()
    read_sha256: str | None = None
    grafted: str = ""         # how the source was grafted into a reference file's workload (evolve/start/graft.py)

    @property
    def sha256(self) -> str:
        return self.read_sha256 or hashlib.sha256(self.source.encode()).hexdigest()

    def for_task(self, task: Any) -> Start:
        """This start as ``task`` runs it: an entry's keyword-only block parameter that has no
        default (JAX's ``matmul(x, y, *, block_shape)``) given one, legal for the task's arrays
        (``mutations.tuning.defaults.required_defaults``); itself when nothing is missing."""
        import libcst as cst

        from mutations import required_defaults

        try:
            module = cst.parse_module(self.source)
        except cst.ParserSyntaxError:
            return self               # the judge says what is wrong with it
        module, given = required_defaults(module, task)
        if not given:
            return self
        return dataclasses.replace(self, source=module.code, defaults=tuple(given.items()), read_sha256=self.sha256)

    @property
    def label(self) -> str:
        """One line: what the start is, e.g. ``jax.experimental.pallas.ops.tpu.flash_attention
        (jax 0.10.2)``, ``seed flash_attention`` or ``file /x/k.py (sha256 1a2b3c4d5e6f)``."""
        if self.kind == "module":
            where = f"{self.distribution} {self.version}" if self.distribution else "no distribution"
            label = f"{self.name} ({where}, sha256 {self.sha256[:12]})"
        else:
            label = f"{self.kind} {self.name} (sha256 {self.sha256[:12]})"
        given = ", ".join(f"{k}={v}" for k, v in self.defaults)
        label += f" with {given} (no default in the source)" if given else ""
        return label + (f"; {self.grafted}" if self.grafted else "")

    def record(self) -> dict[str, Any]:
        """What a run stores of its start (everything but the source itself)."""
        return {"spec": self.spec, "kind": self.kind, "name": self.name, "path": self.path,
                "distribution": self.distribution, "version": self.version, "sha256": self.sha256,
                "label": self.label, "defaults": {k: v for k, v in self.defaults}, "grafted": self.grafted}


def resolve_start(spec: str | None, seed, *, file: bool = False) -> Start:
    """The start ``spec`` names for ``seed`` (a seeds.Seed); ``file``: ``spec`` is a path whatever it
    looks like (a command's FILE argument). UsageError when it cannot be read. For a reference
    file's task, a kernel beside a reference file of its own whose entry takes fewer inputs than
    the workload is grafted into the workload (evolve/start/graft.py)."""
    start = _resolve(spec, seed, file)
    reference = getattr(seed, "reference", None)
    if reference is None or start.kind == "module":
        return start
    from evolve.start.graft import graft_file

    done = graft_file(start.source, start.path, reference)
    if isinstance(done, str):
        raise UsageError(f"{start.label} does not take {Path(reference).name}'s inputs and cannot be grafted into "
                         f"its workload: {done}")
    if done is None:
        return start
    return dataclasses.replace(start, source=done.source, grafted=done.note, read_sha256=start.sha256)


def _resolve(spec: str | None, seed, file: bool) -> Start:
    spec = (spec or "").strip()
    if not spec:
        from seeds import SeedError

        try:
            path = seed.kernel_path
        except SeedError as exc:      # a reference file: no kernel of its own
            raise UsageError(str(exc)) from None
        return Start("", "seed", seed.name, str(path), _read(path, spec))
    if spec == "auto" and not file:       # served by the built-in seeds: resolved before a start is read
        raise UsageError("--start auto serves a reference file with the built-in seeds (evolve/start/serve.py); "
                         "give --reference R.py")
    declared = declared_starts(seed)
    if spec in declared and not file:
        return _module_start(spec, declared[spec])
    if file or "/" in spec or os.sep in spec or spec.endswith(".py") or Path(spec).is_file():
        path = Path(spec).expanduser()
        if path.is_dir() and (path / "kernel.py").is_file():       # a seed directory: its kernel
            path = path / "kernel.py"
        if not path.is_file():
            raise UsageError(f"no kernel file at {spec}; give --start an existing Python file or an "
                             "importable module (e.g. jax.experimental.pallas.ops.tpu.flash_attention)")
        return Start(spec, "file", str(path.resolve()), str(path.resolve()), _read(path, spec))
    if not _DOTTED.match(spec):
        raise UsageError(f"--start {spec!r} is neither a file nor a module name; give a path or a dotted "
                         "module name such as jax.experimental.pallas.ops.tpu.flash_attention")
    if "." not in spec and _no_module(spec):       # a built-in seed's name: its kernel
        from seeds import builtin_seeds, load_seed

        if spec in builtin_seeds():
            path = load_seed(spec).kernel_path
            return Start(spec, "seed", spec, str(path), _read(path, spec))
    return _module_start(spec, spec)


def _no_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def declared_starts(seed) -> dict[str, str]:
    """The short names a seed declares, ``name -> module``."""
    return dict(getattr(seed.task_class, "starts", {}) or {})


def installed_version(module: str) -> tuple[str | None, str | None]:
    """(distribution, version) that ship ``module``'s top-level package, without importing it;
    (None, None) when no installed distribution does."""
    top = module.partition(".")[0]
    try:
        names = importlib.metadata.packages_distributions().get(top) or []
    except Exception:  # noqa: BLE001 - a broken installed distribution: version unknown
        names = []
    for name in sorted(set(names)):
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def _module_start(spec: str, module: str) -> Start:
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        found, why = None, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - a parent package that fails to import, in one line
        raise UsageError(f"--start {spec}: importing the packages above {module} fails "
                         f"({type(exc).__name__}: {_one_line(exc)}); fix that installation") from None
    else:
        why = "no such module"
    if found is None:
        raise UsageError(f"--start {spec}: cannot find module {module} ({why}); install the package that "
                         "provides it, or give a kernel file's path")
    if found.submodule_search_locations is not None:
        children = sorted(m.name for m in pkgutil.iter_modules(found.submodule_search_locations)
                          if not m.name.startswith("_"))
        raise UsageError(f"--start {spec}: {module} is a package, not a kernel module; give one of its "
                         f"modules: {', '.join(f'{module}.{c}' for c in children) or '(none)'}")
    origin = found.origin
    if not origin or not found.has_location or not origin.endswith(".py") or not Path(origin).is_file():
        raise UsageError(f"--start {spec}: module {module} has no Python source file (origin: {origin}); "
                         "give a module installed as .py source, or a kernel file's path")
    distribution, version = installed_version(module)
    return Start(spec, "module", module, origin, _read(Path(origin), spec), distribution, version)


def _read(path: Path, spec: str) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the start {spec or path} at {path}: {_one_line(exc)}; give a readable "
                         "Python file") from None


def check_same_start(recorded: dict[str, Any] | None, start: Start, run_id: str) -> None:
    """A resumed run must start from the source it started from: its replay is only the same run
    then. ``recorded``: the run's stored start (None for runs older than starts: the seed's kernel,
    which is not checked)."""
    if not recorded or recorded.get("sha256") in (None, start.sha256):
        return
    was = recorded.get("label") or recorded.get("name")
    raise UsageError(f"run {run_id} started from {was}, but that start now reads {start.label}; reinstall "
                     "the version it started from to resume it, or start a new run")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]
