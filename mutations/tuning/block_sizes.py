"""Block sizes: move one block-size tunable to another legal value (knows nothing about speed)."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import libcst as cst

from . import block_fields as F
from . import discovery as D
from .. import _sites
from .._base import APPLICABLE, Applicability, Edit, NotApplicable, Operator, parse
from .._tunables import module_ints, read_tunables, set_tunable

# A grid over a kernel's block constants (the ablation's), where its task names no grid points of
# its own: each block tunable's this many largest legal values.
GRID_LARGEST = 3

def legal_values(name: str, task: Any) -> list[int]:
    """Legal values of a block knob, ascending: the task's rule (the seed knows its kernel's
    tiling) for a module-level tunable, or for the tunable a production module's block field maps
    onto (``block_k_major`` -> BLOCK_KV); none if the task does not know it."""
    return list(task.legal_values(F.FIELD_TUNABLES.get(name, name)) or [])


def block_values(source: str, task: Any) -> dict[str, int]:
    """The kernel's block knobs that the task has legal values for, by name, in the source's order:
    its module-level constants (our seeds: BLOCK_Q, BLOCK_KV, HEADS_PER_PROGRAM) or, without
    any, the block fields on the forward path from the task's entry (JAX's ``BlockSizes``:
    block_q, block_k_major, block_k). What the search's first population covers, its cells and
    its surrogate read, whichever idiom the kernel holds its blocks in. ``{}`` if unparsable."""
    try:
        module = parse(source)
    except Exception:  # noqa: BLE001 - an unparsable source has none
        return {}
    ints = module_ints(module)
    present = set(_tunables(module, task))
    if present:
        return {name: value for name, value in ints.items() if name in present}
    with _sites.scope(task):    # a None default: the value the module's own lookup gives, if known
        values = {name: f.value if f.value is not None else _looked_up(task, name)
                  for name, f in _fields(module, task).items()}
        if not values:
            return {name: t.value for name, t in _discovered(module, task).items()}
        return {name: value for name, value in values.items() if value is not None}


def consistent(values: dict[str, int]) -> bool:
    """Whether a set of block values keeps every minor block dividing its major one."""
    return F.consistent(values) is None


def _tunables(module: cst.Module, task: Any) -> list[str]:
    """The kernel's module-level integer constants that the task has legal values for."""
    return sorted(name for name in module_ints(module) if task.legal_values(name) is not None)


def _fields(module: cst.Module, task: Any) -> dict[str, F.Field]:
    """Without module-level block constants: the block fields on the forward path from the task's
    entry (a production module's dataclass or keyword defaults) that the task has legal values for."""
    entry, _ = _sites.current()
    return {name: f for name, f in F.fields(module, entry).items()
            if task.legal_values(f.tunable) is not None}


def _discovered(module: cst.Module, task: Any) -> dict[str, D.Tunable]:
    """Without block constants or block fields the task knows: the tunables discovered in the
    source (every integer that flows into a BlockSpec's block shape, mutations/tuning/discovery.py),
    those with another legal value."""
    if _tunables(module, task) or _fields(module, task):
        return {}
    return {name: t for name, t in D.discover(module, task).items() if len(t.legal) > 1}


SAID = 6        # the blocks left out a "does not apply" names, at most


def _left_out(module: cst.Module, task: Any) -> list[str]:
    """Why no block moves, block by block: each BlockSpec element discovery did not follow (and
    why), and each tunable it found that has no other legal value at the task's shapes."""
    try:
        said = list(D.left_out(module, task))
        single = [t for t in D.discover(module, task).values() if len(t.legal) == 1]
    except Exception:  # noqa: BLE001 - a reason, never a second failure
        return []
    said += [f"`{t.name}` = {t.value} has no other legal value at {task.key} (it tiles "
             f"{', '.join(map(str, t.sizes))})" for t in single]
    return said[:SAID] + ([f"and {len(said) - SAID} more"] if len(said) > SAID else [])


def _unset(module: cst.Module, task: Any) -> list[str]:
    """The block fields the source leaves None (keyword defaults the module fills itself)."""
    return [name for name, f in _fields(module, task).items() if f.value is None]


def _looked_up(task: Any, name: str) -> int | None:
    """What a module picks itself for the block field ``name`` it leaves None (``task.looked_up``)."""
    return getattr(task, "looked_up", lambda _: None)(F.FIELD_TUNABLES[name])


def _draw_all(module: cst.Module, task: Any, rng: random.Random, unset: list[str]) -> dict[str, int]:
    """A value for every block field, one of them moved: a first move from a module's own lookup
    gives all its blocks a value at once, starting where the lookup would (``task.looked_up``,
    e.g. RPA's tuned table) or, where the task does not know it, at a legal value drawn."""
    current = {name: f.value for name, f in _fields(module, task).items()}
    for _ in range(32):
        values = dict(current)
        for name in values:
            if values[name] is None:
                found = _looked_up(task, name)
                values[name] = found if found is not None else rng.choice(legal_values(F.FIELD_TUNABLES[name], task))
        moved = rng.choice(sorted(values))
        others = [v for v in legal_values(F.FIELD_TUNABLES[moved], task) if v != values[moved]]
        if others:
            values[moved] = rng.choice(others)
        if F.consistent(values) is None:
            return values
    raise NotApplicable(f"no consistent legal values for {', '.join(unset)} at {task.key}")


def _field_legal(name: str, values: dict[str, int], task: Any) -> bool:
    """Whether the field ``name`` may take ``values[name]`` beside the other ``values``."""
    return (values[name] in legal_values(F.FIELD_TUNABLES[name], task)
            and F.consistent(values) is None)


# The chance that a drawn move scales the block shape (every sequence tunable at once) instead of
# moving one tunable: growing a square block one side at a time passes through a non-square shape
# that other rewrites (diagonal strips) do not take, so the way up would look bad at each step.
SHAPE_MOVE = 0.5


def _scaled(ints: dict[str, int], names: list[str], task: Any, factor: float) -> dict[str, int] | None:
    """``names`` all scaled by ``factor``, if every new value is legal (else None)."""
    out = {}
    for name in names:
        value = int(ints[name] * factor)
        if value not in legal_values(name, task):
            return None
        out[name] = value
    return out


class BlockSizes(Operator):
    name = "block_sizes"
    knob = True
    sets_shape = True
    chain_rank = 2
    description = ("Move one block-size tunable (a module-level constant such as BLOCK_Q, BLOCK_KV or "
                   "HEADS_PER_PROGRAM, or any integer that flows into a BlockSpec's block shape, in "
                   "whatever style the kernel holds it) to another legal value, or scale the block "
                   "shape (every block tunable but the heads per program) by 2 or 1/2 at once.")

    def shape_values(self, source: str, task: Any) -> dict[str, int]:
        return block_values(source, task)

    def shape_legal(self, name: str, task: Any, source: str | None = None) -> list[int]:
        if source is not None:
            module = parse(source)
            with _sites.scope(task):
                found = _discovered(module, task)
            if name in found:
                return list(found[name].legal)
        return legal_values(name, task)

    def shape_moves(self, source: str, task: Any, shape: dict[str, int]) -> list[dict[str, Any]]:
        """Module-level constants one edit each; a production module's block fields as one shape
        (a minor block must divide its major one at every step), all of them (a module that looks
        its blocks up when one is None overrides a lone one)."""
        from .._tunables import read_tunables

        if not set(shape) & set(read_tunables(source)):
            return [{"shape": dict(shape)}]
        return [{"tunable": n, "value": v} for n, v in shape.items()]

    def shape_majors(self, names: list[str]) -> dict[str, str]:
        """A production module's minor blocks (``block_k`` of ``block_k_major``)."""
        return {name: major for name in names if (major := F.major_of(name)) in names}

    def grid_settings(self, source: str, task: Any, tried: list[Edit], best: Edit | None
                      ) -> list[tuple[Edit, ...]]:
        """Block shapes, largest first: the task's own grid points (``task.grid_shapes()``) that
        are legal (else its largest legal shape), or where it names none the GRID_LARGEST largest
        legal values of each module-level ``BLOCK_*`` constant; and the best move tried alone (a
        module whose blocks are fields, which this grid does not vary, gets its blocks there)."""
        legal = {name: values for name in read_tunables(source)
                 if name.startswith("BLOCK_") and (values := legal_values(name, task))}
        with _sites.scope(task):
            found = {} if legal else _discovered(parse(source), task)
        if found:        # discovered tunables: one edit sets the whole shape
            choices = [[(name, v) for v in t.legal[-GRID_LARGEST:]] for name, t in found.items()]
            points = sorted((dict(c) for c in itertools.product(*choices)),
                            key=lambda shape: -math.prod(shape.values()))
            return [(Edit(self.name, {"shape": shape}),) for shape in points] + ([(best,)] if best is not None else [])
        named = getattr(task, "grid_shapes", lambda: None)()
        if named and all(set(shape) <= set(legal) for shape in named):
            points = ([shape for shape in named if all(v in legal[n] for n, v in shape.items())]
                      or [{name: max(legal[name]) for name in named[0]}])
        else:
            choices = [[(name, v) for v in sorted(values)[-GRID_LARGEST:]] for name, values in sorted(legal.items())]
            points = [dict(choice) for choice in itertools.product(*choices)]
        points.sort(key=lambda shape: -math.prod(shape.values()))
        settings = [tuple(Edit(self.name, {"tunable": n, "value": v}) for n, v in shape.items()) for shape in points]
        return settings + ([(best,)] if best is not None else [])

    def moves(self, source: str, task: Any) -> tuple[str, ...]:
        """The source's module-level constants that the task declares legal values for."""
        try:
            module = parse(source)
            present = set(_tunables(module, task))
            if not present:
                with _sites.scope(task):
                    return tuple(_fields(module, task)) or tuple(_discovered(module, task))
            return tuple(name for name in module_ints(module) if name in present)   # in the source's order
        except Exception:  # noqa: BLE001 - an unparsable source has none
            return ()

    def _choices(self, module: cst.Module, task: Any) -> dict[str, list[int]]:
        if found := _discovered(module, task):
            return {name: [v for v in t.legal if v != t.value] for name, t in found.items()}
        if not _tunables(module, task):
            return self._field_choices(module, task)
        ints = module_ints(module)
        out = {}
        for name in _tunables(module, task):
            values = [v for v in legal_values(name, task) if v != ints[name]]
            if values:
                out[name] = values
        return out

    def _field_choices(self, module: cst.Module, task: Any) -> dict[str, list[int]]:
        current = {name: f.value for name, f in _fields(module, task).items()}
        out = {}
        for name in current:
            values = [v for v in legal_values(F.FIELD_TUNABLES[name], task)
                      if v != current[name] and _field_legal(name, {**current, name: v}, task)]
            if values:
                out[name] = values
        return out

    def _check(self, module, task) -> Applicability:
        present = _tunables(module, task) or list(_fields(module, task)) or list(_discovered(module, task))
        if not present:
            entry, _ = _sites.current()
            if said := _left_out(module, task):
                return Applicability(False, "no block size to move: " + "; ".join(said))
            return Applicability(False, "no module-level block-size constant, nor a block field "
                                        f"({', '.join(F.FIELD_TUNABLES)}) on the forward path from "
                                        f"{entry or 'the entry point'}, that the task has legal values for, "
                                        "nor an integer flowing into a BlockSpec's block shape with "
                                        "another legal value")
        if not self._choices(module, task):
            return Applicability(False, f"no other legal value for {', '.join(present)} at {task.key}")
        return APPLICABLE

    def shapes(self, module: cst.Module, task: Any) -> list[dict[str, int]]:
        """The block shape scaled by 2 and by 1/2 (those legal): a shape is the block tunables
        other than the heads per program, when there are at least two."""
        if found := _discovered(module, task):
            if len(found) < 2:
                return []
            scaled = [{n: int(t.value * factor) for n, t in found.items()} for factor in (2, 0.5)]
            return [shape for shape in scaled if all(v in found[n].legal for n, v in shape.items())]
        if not _tunables(module, task):
            current = {name: f.value for name, f in _fields(module, task).items()}
            if len(current) < 2 or None in current.values():   # a None default has nothing to scale
                return []
            scaled = [{n: int(v * factor) for n, v in current.items()} for factor in (2, 0.5)]
            return [shape for shape in scaled if all(_field_legal(n, shape, task) for n in shape)]
        ints = module_ints(module)
        names = [n for n in _tunables(module, task) if n != "HEADS_PER_PROGRAM"]
        if len(names) < 2:
            return []
        return [shape for factor in (2, 0.5) if (shape := _scaled(ints, names, task, factor))]

    def _sample(self, module, task, rng: random.Random) -> dict[str, Any]:
        if not _tunables(module, task) and (unset := _unset(module, task)):
            return {"shape": _draw_all(module, task, rng, unset)}
        shapes = self.shapes(module, task)
        if shapes and rng.random() < SHAPE_MOVE:
            return {"shape": rng.choice(shapes)}
        choices = self._choices(module, task)
        name = rng.choice(sorted(choices))
        return {"tunable": name, "value": rng.choice(choices[name])}

    def _rewrite(self, module, task, params) -> cst.Module:
        if found := _discovered(module, task):
            return self._rewrite_discovered(module, task, params, found)
        if not _tunables(module, task):
            return self._rewrite_fields(module, task, params)
        if "shape" in params:
            shape = params["shape"]
            if not isinstance(shape, dict) or not shape:
                raise NotApplicable(f"shape={shape!r} is not a mapping of tunables to values")
            for name, value in sorted(shape.items()):
                module = self._rewrite(module, task, {"tunable": name, "value": value})
            return module
        name, value = params.get("tunable"), params.get("value")
        ints = module_ints(module)
        if name not in ints:
            raise NotApplicable(f"the source has no tunable {name!r}")
        if not isinstance(value, int) or isinstance(value, bool) or value not in legal_values(name, task):
            raise NotApplicable(f"{name}={value!r} is not legal at {task.key}: "
                                f"legal values are {legal_values(name, task)}")
        return set_tunable(module, name, str(value))

    def _rewrite_fields(self, module: cst.Module, task: Any, params: dict[str, Any]) -> cst.Module:
        """Set block fields (a production module's dataclass or keyword defaults): one, or the
        whole shape at once; every value legal, every minor block dividing its major."""
        table = _fields(module, task)
        if "shape" in params:
            new = params["shape"]
            if not isinstance(new, dict) or not new:
                raise NotApplicable(f"shape={new!r} is not a mapping of block fields to values")
        else:
            new = {params.get("tunable"): params.get("value")}
        values = {name: f.value for name, f in table.items()}
        for name, value in new.items():
            if name not in table:
                raise NotApplicable(f"the source has no block field {name!r} on the forward path "
                                    f"(it has {', '.join(table) or 'none'})")
            if not isinstance(value, int) or isinstance(value, bool):
                raise NotApplicable(f"{name}={value!r} is not an integer")
            values[name] = value
        for name in new:
            if values[name] not in legal_values(F.FIELD_TUNABLES[name], task):
                raise NotApplicable(f"{name}={values[name]} is not legal at {task.key}: legal values "
                                    f"are {legal_values(F.FIELD_TUNABLES[name], task)}")
        if (why := F.consistent(values)) is not None:
            raise NotApplicable(why)
        left = sorted(n for n, v in values.items() if v is None)
        if left:      # a module that looks its blocks up when any is None (RPA) would ignore the rest
            raise NotApplicable(f"{', '.join(left)} would stay None (the module's own lookup, which "
                                "overrides the fields set beside it): give every block field a value")
        entry, _ = _sites.current()
        return F.set_fields(module, entry, dict(new))

    def _rewrite_discovered(self, module: cst.Module, task: Any, params: dict[str, Any],
                            found: dict[str, D.Tunable]) -> cst.Module:
        """Set discovered tunables (every literal that holds each): one, or the whole shape."""
        new = params["shape"] if "shape" in params else {params.get("tunable"): params.get("value")}
        if not isinstance(new, dict) or not new:
            raise NotApplicable(f"shape={new!r} is not a mapping of tunables to values")
        aliases = {alias: name for name, t in found.items() for alias in t.aliases}
        new = {aliases.get(name, name): value for name, value in new.items()}      # an archived edit's name
        for name, value in new.items():
            if name not in found:
                raise NotApplicable(f"the source has no tunable {name!r} (it has {', '.join(found) or 'none'})")
            if not isinstance(value, int) or isinstance(value, bool) or value not in found[name].legal:
                raise NotApplicable(f"{name}={value!r} is not legal at {task.key}: legal values are "
                                    f"{list(found[name].legal)}")
        return D.set_values(module, task, dict(new))
