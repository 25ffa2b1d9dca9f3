"""Typed run configuration: frozen dataclasses, from flags or a TOML file."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from evolve.errors import UsageError

@dataclasses.dataclass(frozen=True)
class SearchConfig:
    population: int = 8
    generations: int = 4
    tournament_size: int = 3
    crossover_prob: float = 0.3
    drop_prob: float = 0.15         # a child is its parent without one edit (operators only add)
    weighted_drop: bool = True      # the edit dropped: an operator's by how seldom it has paid (else uniform)
    tweak_prob: float = 0.2         # a child is its parent with one edit's parameter moved to the nearest other value
    passed_parents: bool = True     # parents are kernels that passed (a failed one is only ever repaired)
    fit_keys: bool = True           # no child that differs from a bred kernel only in its VMEM limit (one figure)
    local_prob: float = 0.3         # a child is a one-step neighbour: the champion's, or another shape's best's
    ranked_local: bool = True       # that neighbour: the surrogate's pick of up to `oversample` drawn (else the first)
    walk_within: float = 1.25       # another shape's best is walked only within this x the champion's figure (0: any)
    # Elites carried into every generation (the ratchet), and the best of this many other block
    # shapes beside them (quality diversity). None: 2 each, or population - 1 where that is fewer.
    hall_of_fame: int | None = None
    niches: int | None = None
    rng_seed: int = 0
    max_tries: int = 8              # attempts to produce a new (unseen) child before giving up
    # The cascade: a child whose compiler estimate is over prune_factor x the champion's cycles
    # (as of the generation that bred it) is PRUNED after the compile, never checked, never fit.
    # 0 turns it off. Measured timing is never pruned.
    prune_factor: float = 2.0
    stacked: int = 4                # the first population's first shapes that also carry every operator that applies
    max_chain: int = 3              # a mutation applies 1..max_chain operators: several knobs at once
    oversample: int = 3             # breed this many times the children needed; the surrogate ranks them
    adaptive_operators: bool = True  # draw operators by how often they have paid so far
    # Steady state: child i is bred from the results of items up to i - lag. 0: twice the judge's
    # workers, fixed when the run starts (and stored with it, so a resume replays the same run).
    lag: int = 0
    # Distinct kernels to judge, the first population included. 0: population + generations x
    # (population - hall_of_fame).
    budget: int = 0

    def total(self) -> int:
        """How many kernels the run judges (distinct; some may come back from the archive)."""
        return self.budget or self.population + self.generations * (self.population - self.hall_of_fame)

    def __post_init__(self) -> None:
        if self.population < 2:
            raise UsageError(f"population must be at least 2, got {self.population}; use --population 2 or more")
        for name in ("hall_of_fame", "niches"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, min(2, self.population - 1))
        if self.generations < 0:
            raise UsageError(f"generations must be 0 or more, got {self.generations}")
        if self.tournament_size < 1:
            # (drawn with replacement, so it may exceed the population)
            raise UsageError(f"tournament_size must be 1 or more, got {self.tournament_size}")
        if not 0.0 <= self.crossover_prob <= 1.0:
            raise UsageError("crossover_prob must be between 0 and 1")
        if not 0.0 <= self.drop_prob <= 1.0 - self.crossover_prob:
            raise UsageError("drop_prob must be between 0 and 1 - crossover_prob")
        if not 0.0 <= self.local_prob <= 1.0:
            raise UsageError("local_prob must be between 0 and 1")
        if not 0.0 <= self.tweak_prob <= 1.0 - self.crossover_prob - self.drop_prob:
            raise UsageError("tweak_prob must be between 0 and 1 - crossover_prob - drop_prob")
        if self.max_chain < 1:
            raise UsageError(f"max_chain must be at least 1, got {self.max_chain}")
        if self.oversample < 1:
            raise UsageError(f"oversample must be at least 1 (1: no surrogate ranking), got {self.oversample}")
        if self.prune_factor != 0 and self.prune_factor < 1:
            raise UsageError(f"prune_factor must be 0 (off) or at least 1, got {self.prune_factor}")
        if self.budget < 0:
            raise UsageError(f"budget must be at least 1 kernel (0: from the generations), got {self.budget}")
        if self.lag < 0:
            raise UsageError(f"lag must be 0 (twice the workers) or more, got {self.lag}")
        if self.walk_within != 0 and self.walk_within < 1:
            raise UsageError(f"walk_within must be 0 (any) or at least 1, got {self.walk_within}")
        if not 0 <= self.niches < self.population:
            raise UsageError(f"niches must be between 0 and the population size - 1 ({self.population - 1}), "
                             f"got {self.niches}; lower it or raise --population")
        if not 1 <= self.hall_of_fame < self.population:
            raise UsageError(f"hall_of_fame must be at least 1 and smaller than the population ({self.population}), "
                             f"got {self.hall_of_fame}; lower it or raise --population")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """The seed (a built-in name or a seed directory's path) and its problem. ``shape`` None: the
    seed's default; ``causal`` and ``dtype`` None: the seed's default (not every seed has them);
    ``chips`` None: one chip (more only for a seed whose tasks offer a mesh: ``mesh_sizes``);
    ``start`` None: the seed's kernel.py, else the kernel the run starts from (evolve/start/resolve.py);
    ``reference``: a reference file (seeds/reference.py) is the task instead of a seed's, its
    kernel's entry found in the start's source or named by ``entry``."""

    seed: str = "flash_attention"
    shape: str | None = None
    causal: bool | None = None
    dtype: str | None = None
    chips: int | None = None
    start: str | None = None
    reference: str | None = None
    entry: str | None = None
    # A seed's kernel serving the reference file (evolve/start/serve.py): its k-th argument is the
    # workload's input order[k] ("2,0,1"; None: the workload's order)
    order: str | None = None

    def __post_init__(self) -> None:
        if self.reference:     # stored with the run as an absolute path: a resume from elsewhere finds it
            object.__setattr__(self, "reference", str(Path(self.reference).expanduser().absolute()))
            given = [f"--{k}" for k in ("causal", "dtype") if getattr(self, k) is not None]
            given += ["--chips"] if self.chips not in (None, 1) else []
            if given:
                verb = "does" if len(given) == 1 else "do"
                raise UsageError(f"{' and '.join(given)} {verb} not apply to --reference: the reference file's "
                                 "create_inputs() sets the dtypes (and, by its keywords, --shape); drop them")
        if self.order and not self.reference:
            raise UsageError("an input order is for a seed serving a reference file; give --reference R.py")
        self.load_seed()

    def load_seed(self):
        from seeds import SeedError, load_seed
        from seeds import reference_seed

        try:
            return reference_seed(self.reference) if self.reference else load_seed(self.seed)
        except SeedError as exc:
            raise UsageError(str(exc)) from None

    def task(self, kernel_source: str | None = None):
        """The task; for a reference file, its entry is found in ``kernel_source`` (default: the
        start's source)."""
        from seeds import ReferenceSeed

        seed = self.load_seed()
        if isinstance(seed, ReferenceSeed):
            return self._reference_task(seed, kernel_source)
        options = {k: v for k, v in (("causal", self.causal), ("dtype", self.dtype)) if v is not None}
        sizes = seed.task_class.mesh_sizes
        if self.chips is not None and self.chips not in sizes:
            raise UsageError(f"seed {seed.name} runs on {' or '.join(map(str, sizes))} chip(s), not --chips "
                             f"{self.chips}" + ("; use --chips 1" if sizes == (1,) else f"; use --chips {sizes[-1]}"))
        if self.chips is not None and len(sizes) > 1:
            options["chips"] = self.chips
        try:
            return seed.task(self.shape, **options)
        except ValueError as exc:
            raise UsageError(f"bad task for seed {seed.name}: {exc}") from None

    def _reference_task(self, seed, kernel_source: str | None):
        from evolve.start.resolve import resolve_start
        from seeds import SeedError

        if kernel_source is None and (self.start or not self.reference):
            kernel_source = resolve_start(self.start, seed).source
        try:
            return seed.read_task(kernel_source, self.entry, self.shape, self.order)
        except SeedError as exc:
            raise UsageError(str(exc)) from None


@dataclasses.dataclass(frozen=True)
class JudgeSettings:
    chip: str = "v5e"
    timing: str = "auto"
    workers: int = 0                # 0: one per core (per Ray: the cluster's cores, or its TPU chips)
    peers: bool = True              # judge JAX's tuned kernel side by side with the champion
    executor: str = "local"         # where candidates are judged: "local" or "ray" (evolve/executors/base.py)
    # The Ray cluster to join (HOST:PORT or "auto"); "": $RAY_ADDRESS, else a Ray started for the run.
    ray_address: str = ""
    # Address space of each judged child (RLIMIT_AS), GiB; 0: the judge's default (12). A real
    # shape's compile can need more: libtpu's static profile of an 8192-cube matmul peaks at 13 GB.
    memory_gib: int = 0

    def judge_config(self, data_dir: str | Path | None = None):
        """The judge's configuration for these settings: the one place settings become a
        ``JudgeConfig``. A data directory keeps its reference figures in ``<data_dir>/cache``."""
        import os

        from evaluator import Limits
        from evaluator import JudgeConfig

        limits = Limits(memory_bytes=self.memory_gib << 30) if self.memory_gib else Limits()
        return JudgeConfig(chip=self.chip, timing=self.timing, workers=self.workers or max(1, os.cpu_count() or 1),
                           cache_dir=str(Path(data_dir) / "cache") if data_dir is not None else None,
                           limits=limits)

    def __post_init__(self) -> None:
        from evaluator import CHIPS
        from evaluator import timing_choices
        from evolve.executors.base import EXECUTORS

        if self.executor not in EXECUTORS:
            raise UsageError(f"unknown executor {self.executor!r}; use --executor with one of: "
                             f"{', '.join(EXECUTORS.names())}")
        if self.ray_address and self.executor != "ray":
            raise UsageError(f"a Ray address ({self.ray_address}) is for the ray executor; add --executor ray")

        if self.chip not in CHIPS:
            raise UsageError(f"unknown chip {self.chip!r}; use --chip with one of: {', '.join(CHIPS)}")
        if self.workers < 0:
            raise UsageError(f"workers must be 0 (one per core) or more, got {self.workers}")
        if self.memory_gib and not 1 <= self.memory_gib <= 1024:
            raise UsageError(f"--memory {self.memory_gib}: give each judged child's address space in GiB, "
                             "1 to 1024 (0: the default, 12)")
        if self.timing not in timing_choices():
            raise UsageError(f"unknown timing source {self.timing!r}; use one of: {', '.join(timing_choices())}")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    search: SearchConfig = SearchConfig()
    task: TaskConfig = TaskConfig()
    judge: JudgeSettings = JudgeSettings()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # Search keys added after runs were stored, and the value that replays such a run as it was.
    BEFORE = {"stacked": 0, "weighted_drop": False, "tweak_prob": 0.0, "passed_parents": False,
              "local_prob": 0.0, "fit_keys": False, "ranked_local": False,
              "walk_within": 0.0}

    @classmethod
    def stored(cls, data: dict[str, Any]) -> RunConfig:
        """A stored run's configuration: a search key it was stored without takes the value it
        had then (``BEFORE``), so that a resume replays the same run."""
        search = {**cls.BEFORE, **(data.get("search") or {})}
        return cls.from_dict({**data, "search": search})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        parts = {}
        for name, kind in (("search", SearchConfig), ("task", TaskConfig), ("judge", JudgeSettings)):
            section = data.get(name, {}) or {}
            if not isinstance(section, dict):
                raise UsageError(f"config section [{name}] must be a table")
            known = {f.name for f in dataclasses.fields(kind)}
            unknown = set(section) - known
            if unknown:
                raise UsageError(f"unknown key(s) in [{name}]: {', '.join(sorted(unknown))}; "
                                 f"known: {', '.join(sorted(known))}")
            try:
                parts[name] = kind(**section)
            except TypeError as exc:
                raise UsageError(f"bad [{name}] section: {exc}") from None
        unknown = set(data) - {"search", "task", "judge"}
        if unknown:
            raise UsageError(f"unknown config section(s): {', '.join(sorted(unknown))}; "
                             "use [search], [task] and [judge]")
        return cls(**parts)


def load_config(path: str | None, overrides: dict[str, dict[str, Any]]) -> RunConfig:
    """A TOML file (optional) with flag overrides on top; every problem is a UsageError."""
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise UsageError(f"no config file at {path}; check the path given to --config") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read config file {path}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"config file {path} is not valid TOML: {exc}") from None
    for section, values in overrides.items():
        merged = dict(data.get(section, {}) or {})
        merged.update({k: v for k, v in values.items() if v is not None})
        data[section] = merged
    judge = data.get("judge")
    if isinstance(judge, dict) and not {"chip", "memory_gib"} <= set(judge) and isinstance(data.get("task"), dict):
        # No chip (memory) named: the seed's own (what its kernels can be timed on, and in).
        seed = TaskConfig(**{k: v for k, v in data["task"].items() if k == "seed"}).load_seed()
        judge.setdefault("chip", seed.task_class.default_chip)
        if seed.task_class.default_memory_gib:
            judge.setdefault("memory_gib", seed.task_class.default_memory_gib)
    return RunConfig.from_dict(data)
