"""The operator base class and the frozen values every operator returns.

An operator is a source-to-source rewrite of a Pallas kernel module. Whether it applies is a
value (:class:`Applicability`), not an exception; what it did is a value (:class:`MutationResult`)
carrying a replayable :class:`Edit`. Only :meth:`Operator.sample_params` may raise (when asked
for parameters of an operator that does not apply).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import json
import random
from typing import Any, ClassVar, Literal

import libcst as cst

from ._errors import NotApplicable
from ._walk import module_code

Status = Literal["applied", "not_applicable", "failed"]


@dataclasses.dataclass(frozen=True)
class Applicability:
    """Whether an operator applies to a source for a task, and why not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


APPLICABLE = Applicability(True, "")


@dataclasses.dataclass(frozen=True)
class Edit:
    """One operator application with its parameters: replayable, JSON-able."""

    op: str
    params: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # Normalise through JSON so that an edit that round-trips compares equal to itself.
        object.__setattr__(self, "params", json.loads(json.dumps(dict(self.params), sort_keys=True)))

    def __hash__(self) -> int:
        return hash(self.to_json())

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "params": dict(self.params)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Edit:
        return cls(op=str(data["op"]), params=dict(data.get("params", {})))

    @classmethod
    def from_json(cls, text: str) -> Edit:
        return cls.from_dict(json.loads(text))


@dataclasses.dataclass(frozen=True)
class MutationResult:
    """The outcome of applying an operator (or replaying edits). Never an exception."""

    status: Status
    source: str
    edit: Edit | None = None
    reason: str = ""

    @property
    def applied(self) -> bool:
        return self.status == "applied"


@functools.lru_cache(maxsize=512)
def parse(source: str) -> cst.Module:
    """The source's tree, parsed once: libcst trees are immutable, so operators share them."""
    return cst.parse_module(source)


class Operator(abc.ABC):
    """A named source rewrite with a precondition and a sampled parameter space.

    Subclasses set ``name`` and ``description`` and implement ``_check`` (structural match on the
    parsed module plus task-dependent validity), ``_sample`` (parameters from the given
    ``random.Random``; deterministic for a given generator state) and ``_rewrite`` (the libcst
    rewrite). Helpers may raise :class:`NotApplicable`; the public methods turn it into values.
    """

    name: ClassVar[str]
    # False for rewrites that change the arithmetic's precision (the judge decides per task).
    exact: ClassVar[bool] = True
    description: ClassVar[str]
    # The module-level constants the operator sets (the surrogate reads them as features).
    tunables: ClassVar[tuple[str, ...]] = ()
    # A knob: a parameter to tune, not a rewrite to have or not (the ablation grids knobs, and takes
    # every other operator at its best alone).
    knob: ClassVar[bool] = False
    # Where a knob's edit goes in a chain the ablation's grid replays (lower first; every rewrite
    # that is not a knob sits at 0), and, shape first, how the grid nests its knobs.
    chain_rank: ClassVar[int] = 0
    # The judge's verdicts (Status values) this operator's rewrite can turn into a pass, e.g. a
    # VMEM limit for FAIL_VMEM: the search tries the repair on a child that failed that way
    # (``repair_params`` says how), since such a child is often a step that pays once repaired.
    repairs: ClassVar[tuple[str, ...]] = ()
    # The operator that sets a kernel's block shape (at most one): the search's first population
    # spans its shapes (``shape_values``, ``shape_legal``, ``shape_moves``) and then draws it rarely.
    sets_shape: ClassVar[bool] = False
    # The rewrite decides only whether a kernel fits (compiles within a limit), never its figure
    # under the compiler estimate: kernels that differ only in it share one figure (``fit_key``).
    fit_only: ClassVar[bool] = False

    # ---- to implement ---------------------------------------------------------------------
    @abc.abstractmethod
    def _check(self, module: cst.Module, task: Any) -> Applicability:
        """Structural and task precondition (parameters not yet chosen)."""

    @abc.abstractmethod
    def _sample(self, module: cst.Module, task: Any, rng: random.Random) -> dict[str, Any]:
        """Parameters for ``_rewrite``; only called when ``_check`` said ok."""

    @abc.abstractmethod
    def _rewrite(self, module: cst.Module, task: Any, params: dict[str, Any]) -> cst.Module:
        """The rewrite itself; validates ``params`` (raise NotApplicable when illegal)."""

    # ---- a shape operator's (``sets_shape = True``) -----------------------------------------------
    def shape_values(self, source: str, task: Any) -> dict[str, int]:
        """The source's block-shape tunables and their values, in the source's order."""
        raise NotImplementedError(f"{self.name} does not set a block shape")

    def shape_legal(self, name: str, task: Any, source: str | None = None) -> list[int]:
        """The values legal for the tunable ``name`` of ``source`` at ``task``, ascending."""
        raise NotImplementedError(f"{self.name} does not set a block shape")

    def shape_moves(self, source: str, task: Any, shape: dict[str, int]) -> list[dict[str, Any]]:
        """The parameters of the edits that set ``source``'s block shape to ``shape``, in order."""
        raise NotImplementedError(f"{self.name} does not set a block shape")

    def shape_majors(self, names: list[str]) -> dict[str, str]:
        """Of the block tunables ``names``, each minor block's major (the block it divides)."""
        return {}

    def grid_settings(self, source: str, task: Any, tried: list[Any], best: Any | None
                      ) -> list[tuple[Any, ...]]:
        """A knob's settings for the ablation's grid on ``source``, each a tuple of edits (``()``:
        leave it), given the edits ``tried`` alone on the seed and the ``best`` of them that passed
        (None if none did). By default: leave it, or each setting tried."""
        return [()] + [(edit,) for edit in tried]

    def moves(self, source: str, task: Any) -> tuple[str, ...]:
        """The tunables this operator may set on ``source`` for ``task`` (default: ``tunables``)."""
        return self.tunables

    def fit_key(self, source: str, task: Any) -> str:
        """A ``fit_only`` operator's: ``source`` with its setting made one fixed value (``source``
        itself where it does not apply), so that kernels that differ only in it have one key."""
        return source

    def repair_params(self, source: str, task: Any, error: str = "") -> dict[str, Any] | None:
        """The parameters that repair ``source`` after one of ``repairs`` (``error``: the verdict's
        message); None: no repair left."""
        return None

    def pays_on(self, chip: Any) -> bool:
        """Whether the rewrite can make a kernel faster on ``chip`` (an evaluator.chips.Chip); the
        search leaves out an operator that cannot (its draws would only cost evaluations)."""
        return True

    # ---- public API -----------------------------------------------------------------------
    def check(self, source: str, task: Any, site: str | None = None) -> Applicability:
        """Whether the operator applies to ``source`` for ``task`` (at ``site``: a function
        calling pl.pallas_call; None: the one reachable from the task's entry point)."""
        try:
            key = (source, task, site)
            hash(key)
        except TypeError:             # an unhashable task: no memo
            return self._check_now(source, task, site)
        memo = Operator._memo
        if (self.name, key) not in memo:
            if len(memo) > 4096:
                memo.clear()
            memo[(self.name, key)] = self._check_now(source, task, site)
        return memo[(self.name, key)]

    _memo: ClassVar[dict] = {}       # (operator, (source, task, site)) -> Applicability: a pure function

    def _check_now(self, source: str, task: Any, site: str | None = None) -> Applicability:
        from . import _sites

        try:
            module = parse(source)
        except cst.ParserSyntaxError as exc:
            return Applicability(False, f"source does not parse: {_one_line(str(exc))}")
        try:
            with _sites.scope(task, site):
                return self._check(module, task)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        except Exception as exc:  # noqa: BLE001 - a precondition must not raise
            return Applicability(False, f"precondition error: {type(exc).__name__}: {exc}")

    def _draw(self, source: str, task: Any, rng: random.Random) -> dict[str, Any]:
        """``_sample`` in the task's scope; in a module with several pallas_call sites, the
        parameters name the site (so that the edit replays on it)."""
        from . import _sites

        module = parse(source)
        with _sites.scope(task):
            params = self._sample(module, task, rng)
            if _sites.several(module):
                try:
                    params = {**params, _sites.SITE_PARAM: _sites.wrapper(module).name.value}
                except NotApplicable:
                    pass
        return params

    def sample_params(self, source: str, task: Any, rng: random.Random) -> dict[str, Any]:
        """Parameters drawn from ``rng``. Raises ValueError when the operator does not apply."""
        applicability = self.check(source, task)
        if not applicability.ok:
            raise ValueError(f"{self.name} does not apply: {applicability.reason}")
        return self._draw(source, task, rng)

    def apply(self, source: str, task: Any, rng: random.Random) -> MutationResult:
        """Sample parameters from ``rng``, then rewrite. Never raises."""
        applicability = self.check(source, task)
        if not applicability.ok:
            return MutationResult("not_applicable", source, None, applicability.reason)
        try:
            params = self._draw(source, task, rng)
        except NotApplicable as exc:
            return MutationResult("not_applicable", source, None, str(exc))
        except Exception as exc:  # noqa: BLE001
            return MutationResult("failed", source, None,
                                  f"sampling parameters failed: {type(exc).__name__}: {exc}")
        return self.apply_params(source, task, params)

    def apply_params(self, source: str, task: Any, params: dict[str, Any]) -> MutationResult:
        """Rewrite with the given parameters. Never raises. A pure function of its arguments, so
        remembered (``_applied``): replaying a history re-applies its every edit, and a child's
        history is its parent's plus one, so breeding on a large module (JAX's flash attention:
        about 60 KB of source, a second or more per rewrite) would otherwise redo its ancestors'
        rewrites at every child."""
        try:
            edit = Edit(self.name, params)
        except (TypeError, ValueError) as exc:
            return MutationResult("failed", source, None, f"parameters are not JSON-able: {exc}")
        try:
            key = (self.name, source, task, json.dumps(edit.params, sort_keys=True))
            hash(key)
        except TypeError:             # an unhashable task: no memo
            return self._apply_params_now(source, task, edit)
        memo = Operator._applied
        if key not in memo:
            if len(memo) >= 256:      # sources of large modules: a bounded memo
                memo.pop(next(iter(memo)))
            memo[key] = self._apply_params_now(source, task, edit)
        return memo[key]

    _applied: ClassVar[dict] = {}    # (operator, source, task, params) -> MutationResult, oldest first

    def _apply_params_now(self, source: str, task: Any, edit: Edit) -> MutationResult:
        from . import _sites

        params = dict(edit.params)
        site = params.pop(_sites.SITE_PARAM, None)
        if site is not None and not isinstance(site, str):
            return MutationResult("failed", source, edit, f"site={site!r} is not a function's name")
        applicability = self.check(source, task, site)
        if not applicability.ok:
            return MutationResult("not_applicable", source, edit, applicability.reason)
        try:
            with _sites.scope(task, site):
                new_module = self._rewrite(parse(source), task, params)
            new_source = module_code(new_module)
            compile(new_source, "<mutated kernel>", "exec")
        except NotApplicable as exc:
            return MutationResult("not_applicable", source, edit, str(exc))
        except Exception as exc:  # noqa: BLE001
            return MutationResult("failed", source, edit,
                                  f"rewrite failed: {type(exc).__name__}: {_one_line(str(exc))}")
        if new_source == source:
            return MutationResult("not_applicable", source, edit, "the rewrite changes nothing")
        return MutationResult("applied", new_source, edit, "")

    def __repr__(self) -> str:
        return f"<Operator {self.name}: {self.description}>"


class Rewrite(Operator):
    """An operator without parameters: one rewrite, which applies or does not. Subclasses
    implement ``_check`` and ``_apply``."""

    def _sample(self, module: cst.Module, task: Any, rng: random.Random) -> dict[str, Any]:
        return {}

    def _rewrite(self, module: cst.Module, task: Any, params: dict[str, Any]) -> cst.Module:
        if params:
            raise NotApplicable(f"{self.name} takes no parameters, got {sorted(params)}")
        return self._apply(module, task)

    @abc.abstractmethod
    def _apply(self, module: cst.Module, task: Any) -> cst.Module:
        """The rewrite (raise NotApplicable where it cannot be made)."""


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]
