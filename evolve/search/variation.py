"""Variation: mutation by a chain of applicable operators, crossover by replaying two edit histories."""

from __future__ import annotations

import itertools
import json
import math
import random
from typing import Any

from evolve.search.individual import Individual
from mutations import Edit, all_operators, get_operator
from mutations import replay_applicable
from mutations import consistent


# The chance that a move's next edit is drawn among the operators its last edit made applicable.
UNLOCKED = 0.8


def _pick(operators: list, weights: dict[str, float] | None, rng: random.Random):
    """One operator, drawn with probability proportional to its weight (1 for unknown ones)."""
    w = [max((weights or {}).get(op.name, 1.0), 1e-6) for op in operators]
    return rng.choices(operators, weights=w, k=1)[0]


def mutate(parent: Individual, task: Any, rng: random.Random, generation: int, max_chain: int = 1,
           weights: dict[str, float] | None = None, operators: list | None = None) -> Individual | None:
    """Apply a chain of 1..``max_chain`` operators (how many drawn from ``rng``), each chosen
    among those that apply (of ``operators``, default every registered one), with probability by
    ``weights`` (what has paid so far), and with parameters from ``rng``. A chain changes several
    knobs in one move. An operator that the chain's last edit made applicable (its prerequisite
    was just applied) is drawn next with probability ``UNLOCKED``, one edit past ``max_chain`` if
    need be."""
    pool = all_operators() if operators is None else operators
    length = rng.randint(1, max(1, max_chain))
    source, chain, unlocked = parent.source, [], set()
    while len(chain) < length:
        used = {e.op for e in chain}          # one edit per operator in a move
        applicable = [op for op in pool if op.name not in used and op.check(source, task)]
        first = [op for op in applicable if op.name in unlocked]
        if not (first and rng.random() < UNLOCKED):
            first = []
        before = {other.name for other in pool if other.check(source, task)}
        while applicable:
            op = _pick(first or applicable, weights, rng)
            if op in first:
                first.remove(op)
            applicable.remove(op)
            result = op.apply(source, task, rng)
            if result.applied and result.source != source and result.edit is not None:
                source, chain = result.source, chain + [result.edit]
                # What this edit made applicable (an operator whose precondition it met) is drawn
                # next, in the same move: a prerequisite that does not pay alone is not judged alone.
                unlocked = {o.name for o in pool if o.name not in before and o.name not in used
                            and o.check(source, task)}
                if unlocked and len(chain) == length and length < max_chain + 1:
                    length += 1
                break
        else:
            break
    if not chain:
        return None
    name = "+".join(e.op for e in chain)
    params = dict(chain[0].params) if len(chain) == 1 else {"chain": [e.to_dict() for e in chain]}
    return Individual(source, edits=parent.edits + [e.to_dict() for e in chain], parent_ids=(parent.id,),
                      operator=name, params=params, generation=generation)


def covering_shapes(values: list[list[int]], current: tuple[int, ...], rng: random.Random,
                    majors: dict[int, int] | None = None) -> list[tuple[int, ...]]:
    """Every combination of ``values`` but ``current``, ordered so that the first ones cover each
    tunable's legal values: first the values paired by rank (the smallest of each together, then
    the next: the seed's shape scaled, where every tunable has as many values), then the rest at
    random. A small first population so spans every size of every tunable, not a random corner.
    ``majors`` maps a minor block's position to its major's (a minor block divides its major): a
    minor block as large as its major splits nothing, so the ranked shapes pair each minor with
    the size below its major's (the smallest where there is none below)."""
    if not values:
        return []
    longest = max(len(v) for v in values)
    ranked = [[v[min(i * len(v) // longest, len(v) - 1)] for v in values] for i in range(longest)]
    for shape in ranked:
        for minor, major in (majors or {}).items():
            below = [v for v in values[minor] if v < shape[major]]
            shape[minor] = below[-1] if below else values[minor][0]
    ranked = [tuple(shape) for shape in ranked]
    ranked = [s for s in dict.fromkeys(ranked) if s != current]
    rest = [s for s in itertools.product(*values) if s != current and s not in ranked]
    rng.shuffle(ranked)
    rng.shuffle(rest)
    return ranked + rest


def stack(source: str, task: Any, rng: random.Random, operators: list) -> tuple[str, list[Edit]]:
    """Every operator of ``operators`` that applies, once each, in a random order, until none
    that is left applies (an edit that makes another applicable, by meeting its precondition,
    lets it in): the kitchen sink. Its edits are what drop moves prune afterwards."""
    chain: list[Edit] = []
    left = list(operators)
    while True:
        applicable = [op for op in left if op.check(source, task)]
        if not applicable:
            return source, chain
        op = rng.choice(applicable)
        left.remove(op)
        result = op.apply(source, task, rng)
        if result.applied and result.source != source and result.edit is not None:
            source, chain = result.source, chain + [result.edit]


def block_shapes(seed: Individual, task: Any, rng: random.Random, count: int, generation: int = 0,
                 max_chain: int = 1, chained: float = 0.75, operators: list | None = None,
                 stacked: int = 0) -> list[Individual]:
    """``count`` children of the seed with distinct block shapes (the values of the seed's tunables
    that the task declares legal values for, as the shape operator reads them: ``Operator.sets_shape``),
    in :func:`covering_shapes`' order; with probability ``chained`` each is followed by a chain of
    1..max_chain-1 other operators, drawn to cover every operator before any repeats: a first
    population that spans the block shapes and tells the search (and its surrogate) what each
    operator does."""
    from mutations import shape_operator

    blocks = shape_operator()
    if blocks is None:
        return []
    current = blocks.shape_values(seed.source, task)              # in the source's order
    names = list(current)
    majors = {names.index(minor): names.index(major) for minor, major in blocks.shape_majors(names).items()}
    shapes = covering_shapes([blocks.shape_legal(n, task, seed.source) for n in names], tuple(current.values()),
                             rng, majors)
    pool = all_operators() if operators is None else operators
    others = [op for op in pool if op.name != blocks.name]
    used = {op.name: 0 for op in others}
    children = []
    for shape in shapes:
        if len(children) == count:
            break
        source, edits = seed.source, []
        for params in blocks.shape_moves(seed.source, task, dict(zip(names, shape))):
            result = blocks.apply_params(source, task, params)
            if result.applied:
                source, edits = result.source, edits + [result.edit]
        if not edits:
            continue
        child = Individual(source, edits=[e.to_dict() for e in edits], parent_ids=(seed.id,),
                           operator="+".join(e.op for e in edits), generation=generation,
                           params={"chain": [e.to_dict() for e in edits]} if len(edits) > 1 else
                           dict(edits[0].params))
        if len(children) < stacked:
            # The first shapes (those that cover each block's sizes) also carry every other
            # operator that applies: a multi-step kernel whose first step alone does not pay
            # (large blocks need causal skipping, then strips) is judged at once.
            source, more = stack(source, task, rng, others)
            chain = edits + more
            child = Individual(source, edits=[e.to_dict() for e in chain], parent_ids=(seed.id,),
                               operator="+".join(e.op for e in chain), generation=generation,
                               params={"chain": [e.to_dict() for e in chain]})
        elif max_chain > 1 and rng.random() < chained:
            fewest = min(used.values())       # operators used least so far are drawn first
            weights = {name: 1.0 if n == fewest else 0.02 for name, n in used.items()} | {blocks.name: 0.02}
            more = mutate(child, task, rng, generation, max_chain=max_chain - 1, weights=weights, operators=pool)
            if more is not None:
                chain = edits + [Edit.from_dict(e) for e in more.edits[len(edits):]]
                for e in chain[len(edits):]:
                    used[e.op] = used.get(e.op, 0) + 1
                child = Individual(more.source, edits=[e.to_dict() for e in chain], parent_ids=(seed.id,),
                                   operator="+".join(e.op for e in chain), generation=generation,
                                   params={"chain": [e.to_dict() for e in chain]})
        children.append(child)
    return children


def drop_chance(op: str, weights: dict[str, float] | None) -> float:
    """How likely an edit of ``op`` is to be undone: by how seldom its operator has paid
    (``weights``: what has paid so far, 0.5 where unknown)."""
    return max(1.0 - (weights or {}).get(op, 0.5), 1e-6)


def tweak_chance(op: str, weights: dict[str, float] | None) -> float:
    """How likely an edit of ``op`` is to have its parameter moved: by how often its operator has paid."""
    return max((weights or {}).get(op, 0.5), 1e-6)


def drop_edit(parent: Individual, seed_source: str, task: Any, rng: random.Random,
              generation: int, weights: dict[str, float] | None = None) -> Individual | None:
    """The parent's history without one of its edits, replayed on the seed; edits that no longer
    apply without it are dropped too. Operators only add: this is how a search undoes an edit
    that stopped paying once others came (a rewrite that paid at small blocks may cost at large
    ones). The edit is drawn at random, an operator's edits with probability by how seldom it has
    paid (1 - ``weights``, what has paid so far; uniform without them)."""
    if not parent.edits:
        return None
    chance = [drop_chance(e["op"], weights) for e in parent.edits]
    gone = rng.choices(range(len(parent.edits)), weights=chance, k=1)[0] if weights else \
        rng.randrange(len(parent.edits))
    return dropped(parent, gone, seed_source, task, generation)


def dropped(parent: Individual, gone: int, seed_source: str, task: Any, generation: int) -> Individual | None:
    source, kept = replay_applicable(seed_source, parent.edits[:gone] + parent.edits[gone + 1:], task)
    if source == parent.source or not kept:
        return None
    return Individual(source, edits=kept, parent_ids=(parent.id,), operator="drop",
                      params={"dropped": parent.edits[gone]}, generation=generation)


def crossover(a: Individual, b: Individual, seed_source: str, task: Any, rng: random.Random,
              generation: int) -> Individual | None:
    """One-point crossover of two edit histories, replayed on the seed; edits that no longer
    apply are dropped. The child records both parents."""
    cut_a = rng.randint(0, len(a.edits))
    cut_b = rng.randint(0, len(b.edits))
    source, kept = replay_applicable(seed_source, a.edits[:cut_a] + b.edits[cut_b:], task)
    if source in (a.source, b.source) or not kept:
        return None
    return Individual(source, edits=kept, parent_ids=(a.id, b.id), operator="crossover",
                      params={"cut_a": cut_a, "cut_b": cut_b}, generation=generation)


def _numbers(params: Any, path: str = "") -> dict[str, Any]:
    """A parameter set flattened to its leaves (a block shape's sizes are leaves too)."""
    if isinstance(params, dict):
        out: dict[str, Any] = {}
        for key, value in params.items():
            out |= _numbers(value, f"{path}/{key}")
        return out
    return {path: params}


def _distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """How far apart two parameter sets of one operator are: the sum of |log2| ratios of their
    numbers; another tunable, site or any other leaf that differs is not a neighbour (inf)."""
    x, y = _numbers(a), _numbers(b)
    if x.keys() != y.keys():
        return math.inf
    total = 0.0
    for key in x:
        u, v = x[key], y[key]
        if u == v:
            continue
        if isinstance(u, int) and isinstance(v, int) and not isinstance(u, bool) and u > 0 and v > 0:
            total += abs(math.log2(v) - math.log2(u))
        else:
            return math.inf
    return total


def shape_steps(op: Any, params: dict[str, Any], before: str, task: Any) -> list[dict[str, Any]]:
    """A block shape's one-step neighbours, made rather than drawn: each of its sizes moved to the
    next legal value up or down (the others kept, the minor blocks still dividing their majors).
    A shape edit's draws scale every size at once or redraw the whole shape, so a step of one size
    (block_k 2048 -> 1024 under 2048-wide majors) came only at the chance of drawing it."""
    shape = params.get("shape")
    if not op.sets_shape or not isinstance(shape, dict):
        return []
    out = []
    for name, value in shape.items():
        legal = sorted(op.shape_legal(name, task, before))
        if value not in legal:
            continue
        k = legal.index(value)
        for step in (legal[k - 1] if k else None, legal[k + 1] if k + 1 < len(legal) else None):
            moved = {**shape, name: step}
            if step is not None and consistent(moved):
                out.append({**params, "shape": moved})
    return out


def tied_steps(op: Any, params: dict[str, Any], before: str, task: Any) -> list[dict[str, Any]]:
    """A block shape's sizes that are equal moved a step together (up or down, where the value is
    legal for each): a square block (block_q = block_k_major) grown as a square, which a step of
    one size, leaving a shape that diagonal strips do not take, reaches only in two."""
    shape = params.get("shape")
    if not op.sets_shape or not isinstance(shape, dict):
        return []
    out = []
    for value in sorted({v for v in shape.values() if list(shape.values()).count(v) > 1}):
        names = [n for n, v in shape.items() if v == value]
        for factor in (2, 0.5):
            moved = {**shape, **{n: int(value * factor) for n in names}}
            if all(moved[n] in op.shape_legal(n, task, before) for n in names) and consistent(moved):
                out.append({**params, "shape": moved})
    return out


def nearest(parent: Individual, i: int, seed_source: str, task: Any, rng: random.Random,
            draws: int = 64) -> list[dict[str, Any]]:
    """The parameter sets nearest to edit ``i``'s (by :func:`_distance`) among ``draws`` draws of
    its operator at that point of the parent's history, in a stable order."""
    edit = parent.edits[i]
    op = get_operator(edit["op"])
    before, _ = replay_applicable(seed_source, parent.edits[:i], task)
    options: dict[str, dict[str, Any]] = {}
    if not op.check(before, task).ok:
        return []
    for _ in range(draws):          # draws of parameters only: the rewrite is made once, for the pick
        params = Edit(edit["op"], op.sample_params(before, task, random.Random(rng.random()))).params
        if params != edit.get("params"):
            options.setdefault(json.dumps(params, sort_keys=True), params)
    for params in shape_steps(op, edit.get("params") or {}, before, task):
        options.setdefault(json.dumps(params, sort_keys=True), params)
    ranked = sorted((_distance(edit.get("params") or {}, params), key) for key, params in options.items())
    return [options[key] for distance, key in ranked if distance == ranked[0][0] < math.inf] if ranked else []


def tweaked(parent: Individual, i: int, params: dict[str, Any], seed_source: str, task: Any,
             generation: int) -> Individual | None:
    edit = parent.edits[i]
    edits = parent.edits[:i] + [{"op": edit["op"], "params": params}] + parent.edits[i + 1:]
    source, kept = replay_applicable(seed_source, edits, task)
    if source == parent.source or not kept:
        return None
    return Individual(source, edits=kept, parent_ids=(parent.id,), operator="tweak",
                      params={"edit": edit, "to": params}, generation=generation)


def knobs(parent: Individual) -> list[int]:
    """The indices of the parent's edits that have parameters to move."""
    return [i for i, e in enumerate(parent.edits) if _numbers(e.get("params") or {})]


def tweak_edit(parent: Individual, seed_source: str, task: Any, rng: random.Random, generation: int,
               weights: dict[str, float] | None = None, draws: int = 64) -> Individual | None:
    """The parent's history with one edit's parameters moved to the nearest other value its
    operator draws at that point (strips of 1024 to 512, a block of 1024 to 2048 or 512), replayed
    on the seed: the local step that a structure found at a random parameter needs, and that a new
    edit of the same operator on top would take only at the chance of drawing that value. The
    edit is drawn by how often its operator has paid (``weights``; uniform without them): a knob
    that has never changed a figure (a VMEM limit the kernel does not need) is seldom moved."""
    left = knobs(parent)
    chance = [tweak_chance(parent.edits[i]["op"], weights) for i in left]
    order = []
    while left:                       # drawn without replacement, by weight
        k = rng.choices(range(len(left)), weights=chance, k=1)[0]
        order.append(left.pop(k))
        chance.pop(k)
    for i in order:                   # the first edit drawn that has a neighbour moves
        near = nearest(parent, i, seed_source, task, rng, draws)
        child = tweaked(parent, i, rng.choice(near), seed_source, task, generation) if near else None
        if child is not None:
            return child
    return None
