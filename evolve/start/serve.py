"""A reference file with no kernel: the built-in seeds that can serve it, tried on the judge.

``evolve run --reference R.py`` with no kernel (no ``--start``, no ``kernel.py`` beside R), or
``--start auto`` on ``run`` and ``eval``: every built-in seed whose reference file declares a
``SIGNATURE`` (seeds/signature.py) is offered R's inputs. A seed fits where some order of R's
inputs gives each of its parameters an input of its dtype and rank, with its dimension symbols
bound to one size each (the order best matching the names first). Each fitting seed's kernel is
judged against *R's* workload, on the judge's secret draws, in up to ``TRIES`` of its fitting
orders, until one passes. The start is the passing seed with the best figure; the others, and the
seeds that did not fit, are listed with the reason. No seed passing is a UsageError (exit 2)
naming every seed tried, and nothing is stored.

A run's population is edits replayed on one start (evolve/search), so of several seeds that pass,
the fastest starts the run and the report names the others with their figures.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from evolve.errors import UsageError

AUTO = "auto"
TRIES = 3                 # orders judged per fitting seed (the first that passes is taken)


@dataclasses.dataclass(frozen=True)
class Offer:
    """One seed's answer for the reference file: the orders it was judged in and how that went."""

    seed: str
    fits: int = 0                      # orders of the inputs that fit its signature
    order: str = ""                    # the order judged last ("" : the workload's own)
    mapping: str = ""                  # the same, as its parameters' names = the workload's
    status: str = ""                   # the judge's verdict on it ("" : not judged)
    speedup: float | None = None       # vs the reference file's XLA program, same judge
    why: str = ""                      # one phrase: why it was not taken

    @property
    def passed(self) -> bool:
        return self.status == "PASS"

    def line(self, taken: bool) -> str:
        where = f" ({self.mapping})" if self.mapping else ""
        if taken:
            return f"  {self.seed}: PASS{where}, {self.speedup:.3f}x the XLA program: taken"
        if self.passed:
            return f"  {self.seed}: PASS{where}, {self.speedup:.3f}x the XLA program: slower than the one taken"
        return f"  {self.seed}: {self.status + where + ': ' if self.status else ''}{self.why}"


@dataclasses.dataclass(frozen=True)
class Served:
    """What serving found: the seed taken (None: none passed) and every offer."""

    reference: str
    offers: tuple[Offer, ...]
    taken: Offer | None

    def report(self) -> str:
        head = f"seeds tried for {Path(self.reference).name} (no kernel given):"
        return "\n".join([head, *(o.line(o is self.taken) for o in self.offers)])


def wants_serving(task_config) -> bool:
    """Whether a command's task asks to be served: ``--start auto``, or a reference file with no
    ``--start`` and no kernel.py of its own beside it."""
    if task_config.start == AUTO:
        if not task_config.reference:
            raise UsageError("--start auto serves a reference file with the built-in seeds; give --reference R.py")
        return True
    if task_config.start or not task_config.reference:
        return False
    reference = Path(task_config.reference)
    return not (reference.name == "reference.py" and (reference.parent / "kernel.py").is_file())


def candidates() -> list[tuple[str, Path]]:
    """Every built-in seed that is a reference file with a kernel: (name, reference.py)."""
    from seeds import builtin_seeds, load_seed

    found = [(name, load_seed(name).directory) for name in builtin_seeds()]
    return [(name, d / "reference.py") for name, d in found
            if (d / "reference.py").is_file() and (d / "kernel.py").is_file()]


def serving_memory() -> int:
    """The address space (GiB) a judge that serves a reference file gives its children when no
    --memory is given: the most any serving seed names for its own tasks (``MEMORY``; 0: the
    judge's default), since the user's workload may be that seed's at its model shape."""
    from seeds import load_seed

    return max((load_seed(name).task_class.default_memory_gib for name, _ in candidates()), default=0)


def serve(task_config, judging, progress=None) -> Served:
    """Offer the reference file of ``task_config`` to every seed; judge the fitting ones:
    ``judging(task)`` is the function that judges a source on ``task`` (an executor's, evolve/
    executors/base.py; it is not called when no seed fits). ``progress``: called with a line
    before each judgement."""
    from seeds import SeedError, reference_seed
    from seeds.signature import SignatureError, declared, fits, why_not

    seed = reference_seed(task_config.reference)
    try:
        bare = seed.read_task(None, shape=task_config.shape)
    except SeedError as exc:
        raise UsageError(str(exc)) from None
    specs = bare.input_specs()
    names = tuple(bare.input_names)
    offers = []
    for name, path in candidates():
        try:
            params = declared(path)
        except (SignatureError, SyntaxError) as exc:
            offers.append(Offer(name, why=f"its SIGNATURE cannot be read: {exc}"))
            continue
        if params is None:
            offers.append(Offer(name, why="its reference file declares no SIGNATURE"))
            continue
        orders = fits(params, specs, names)
        if not orders:
            offers.append(Offer(name, why=why_not(params, specs)))
            continue
        offers.append(_judged(name, path, [(o, ", ".join(f"{params[k].name}={names[i]}" for k, i in enumerate(o)))
                                           for o in orders], seed, task_config, judging, progress))
    passed = [o for o in offers if o.passed]
    taken = max(passed, key=lambda o: o.speedup or 0.0) if passed else None
    return Served(str(task_config.reference), tuple(offers), taken)


def _judged(name: str, path: Path, orders: list[tuple[tuple[int, ...], str]], seed, task_config, judging,
            progress) -> Offer:
    from seeds import SeedError

    kernel = (path.parent / "kernel.py").read_text()
    last = Offer(name, fits=len(orders))
    for order, mapping in orders[:TRIES]:
        text = "" if order == tuple(range(len(order))) else ",".join(map(str, order))
        try:
            task = seed.read_task(kernel, shape=task_config.shape, order=text or None)
        except SeedError as exc:
            return dataclasses.replace(last, why=f"cannot call its kernel: {exc}")
        if progress:
            progress(f"judging seed {name}'s kernel on the reference's inputs ({mapping})")
        result = judging(task)(kernel)
        first = (result.error or "").strip().splitlines()[0][:160] if result.error else ""
        last = Offer(name, fits=len(orders), order=text, mapping=mapping, status=result.status.value,
                     speedup=result.metrics.speedup_vs_reference, why=first or "no figure")
        if result.ok:
            return last
    if len(orders) > TRIES:
        last = dataclasses.replace(last, why=f"{last.why} (judged in {TRIES} of its {len(orders)} fitting orders)")
    return last


def served_config(task_config, served: Served):
    """``task_config`` starting from the seed taken, or a UsageError naming every seed tried."""
    if served.taken is None:
        tried = "; ".join(f"{o.seed} ({o.status + ': ' if o.status else ''}{o.why})" for o in served.offers)
        raise UsageError(f"no built-in seed serves {Path(served.reference).name}: {tried}; bring a kernel "
                         "(evolve eval K.py --reference R.py, or --start K.py)")
    return dataclasses.replace(task_config, start=served.taken.seed, order=served.taken.order or None)
