"""The evolutionary loop: DEAP's toolbox, tournament selection, a hall of fame as the ratchet,
run steady-state so that no worker waits for a generation's straggler.

    items 0..n0-1   <- seed + distinct block shapes (first those that cover every legal size of
                       each block, the first `stacked` of them carrying every other operator
                       that applies), most others with a chain of other operators that covers them all
    item i >= n0    <- bred as soon as items 0..i-lag have been judged and taken in (in index
                       order), from the pool as it stood then:
        repair   <- first, a child that failed in a way an operator repairs (FAIL_VMEM: the
                    VMEM limit) is repaired: a bigger block is often a step that pays once it fits
        pool     <- the hall of fame (the best PASS ever seen; never lost) + the best kernel of
                    each of the next `niches` block shapes (MAP-Elites' cells: a shape whose
                    next steps have not paid yet stays in reach) + the latest items taken in
        parents  <- tournament selection from the pool
        child    <- crossover (replay two edit histories), a drop (the parent without one of its
                    edits, the least-paying operator's most likely) or mutation (a chain of
                    operators, drawn by what has paid so far);
                    oversample x candidates ranked by the surrogate (evolve/search/surrogate.py) once
                    it has data; the best ranked is judged
    a "generation" is a bookkeeping unit: every population - hall_of_fame items taken in.
    nothing passed yet <- no parent: only repairs are bred; with every kernel bred taken in and
                          none passed, the run stops (``stopped``: its generation; the run reports why)

Results are taken in strictly in index order and child i sees only items up to i - lag, so the
same configuration and RNG seed give the same run whatever order the workers finish in (under
a deterministic timing source). With lag >= workers, a worker that frees always finds a child
bred for it unless `lag - workers` later children all finished before one straggler.
Resuming replays the run from the start: every verdict already archived comes back from the
archive, so nothing is judged twice and the replay reaches the same state.
"""

from __future__ import annotations

import concurrent.futures
import random
from collections.abc import Callable
from typing import Any

from deap import tools

from evolve.config import RunConfig
from evolve.search.individual import Individual
from evolve.search.surrogate import Surrogate
from evolve.search.toolbox import make_statistics, make_toolbox
from evolve.search.variation import (block_shapes, drop_chance, dropped, knobs, nearest,
                              tied_steps, tweak_chance, tweaked)
from mutations import all_operators, block_values, read_tunables
from mutations import replay_applicable



def surrogate_tunables(operators: list, seed_source: str, task: Any) -> list[str]:
    """The tunables the surrogate reads: what each of the run's operators says it moves (block
    sizes: the seed's constants the task has legal values for), in the operators' order."""
    out: list[str] = []
    for op in operators:
        out += [t for t in op.moves(seed_source, task) if t not in out]
    return out


def item_rng(rng_seed: int, index: int) -> str:
    """The RNG state that breeds item ``index`` (a seed string): a replay breeds it again."""
    return f"pallas-evolve:{rng_seed}:item:{index}"


def beats(challenger: Individual, champion: Individual | None) -> bool:
    """The ratchet's rule. With measured timings a challenger must be faster beyond the
    confidence intervals; with a deterministic estimate, faster is enough."""
    if not challenger.passed:
        return False
    if champion is None or not champion.passed:
        return True
    a, b = challenger.result.metrics, champion.result.metrics
    if a.latency_ci_s and b.latency_ci_s:
        return a.latency_ci_s[1] < b.latency_ci_s[0]
    return challenger.merit > champion.merit


def search_operators(chip: str) -> list:
    """The operators the search draws from: those that can pay on the judge's chip."""
    from evaluator import get_chip

    target = get_chip(chip)
    return [op for op in all_operators() if op.pays_on(target)]


class Search:
    """One run's search state. ``run(executor)`` judges items through the executor."""

    def __init__(self, config: RunConfig, seed_source: str, task, *, evaluate: Callable, record: Callable,
                 on_generation: Callable[[int, list[Individual], Search], None] = lambda *a: None):
        self.config = config
        self.seed_source = seed_source
        self.task = task
        self.operators = search_operators(config.judge.chip)
        self.toolbox = make_toolbox(config, seed_source, task, evaluate=evaluate, record=record,
                                    operators=self.operators)
        self.on_generation = on_generation
        self.hof = tools.HallOfFame(config.search.hall_of_fame, similar=lambda a, b: a.id == b.id)
        self.stats = make_statistics()
        self.logbook = tools.Logbook()
        self.champion: Individual | None = None
        self.seen: set[str] = set()
        self.taken: list[Individual] = []             # items taken in, in index order
        tunables = surrogate_tunables(self.operators, seed_source, task)
        self.cell_tunables = list(block_values(seed_source, task))
        shape = [name for name in self.cell_tunables if name in tunables]
        self.surrogate = Surrogate([op.name for op in self.operators], tunables,
                                   pairs=[(a, b) for i, a in enumerate(shape) for b in shape[i + 1:]],
                                   read=lambda source: read_tunables(source) | block_values(source, task))
        self.credit: dict[str, list[int]] = {}        # operator -> [tries, wins over the parent]
        self.speedups: dict[str, float] = {}          # individual id -> speedup (PASS only)
        self.learned: set[str] = set()
        self.repairs: list[Individual] = []            # children failed in a way an operator repairs
        self.repairable = {status for op in self.operators for status in op.repairs}
        self.cells: dict[str, tuple] = {}             # individual id -> its block shape (parsed once)
        self.near: dict[tuple, list[tuple]] = {}      # (champion?, walked id) -> its one-step moves not drawn yet
        self.turns = 0                                 # local steps taken (whose turn: see walked)
        # Operators whose rewrite decides only whether a kernel fits, and the fit keys of the
        # kernels bred: a child whose figure the run already has (or will) is not bred again.
        self.fit_ops = [op for op in self.operators if op.fit_only] if config.search.fit_keys else []
        self.fits: set[str] = set()
        self.keys: dict[str, str] = {}                # individual id -> its fit key (made once)
        self.stopped: int | None = None               # the generation the run stopped in: nothing passed

    def weights(self) -> dict[str, float] | None:
        """Each operator's chance of paying off (Laplace: (wins + 1) / (tries + 2))."""
        if not self.config.search.adaptive_operators:
            return None
        return {op: (wins + 1) / (tries + 2) for op, (tries, wins) in self.credit.items()}

    def learn(self, individuals: list[Individual]) -> None:
        """Feed judged individuals to the surrogate and the operators' payoff, once each."""
        for ind in individuals:
            if ind.result is None or ind.id in self.learned:
                continue
            self.learned.add(ind.id)
            m = ind.result.metrics
            if ind.result.ok or ind.result.status.value == "PRUNED":
                self.surrogate.add(ind.id, ind.source, ind.edits, m.estimated_cycles)
            if ind.passed:
                self.speedups[ind.id] = ind.merit
            if ind.operator in ("seed", "crossover", "drop") or not ind.parent_ids:
                continue
            parent = self.speedups.get(ind.parent_ids[0])
            won = ind.passed and parent is not None and ind.merit > parent
            # A tweak is credited to the operator whose parameter it moved.
            ops = [ind.params["edit"]["op"]] if ind.operator == "tweak" else ind.operator.split("+")
            for op in ops:
                tries, wins = self.credit.get(op, [0, 0])
                self.credit[op] = [tries + 1, wins + int(won)]

    def record(self, individuals: list[Individual]) -> None:
        """Take judged individuals in: what the search learns, the hall of fame, the champion."""
        self.learn(individuals)
        self.repairs += [ind for ind in individuals if ind.result is not None and ind.edits
                         and ind.result.status.value in self.repairable]
        passed = [ind for ind in individuals if ind.passed]
        self.hof.update(passed)
        for ind in passed:
            if beats(ind, self.champion):
                self.champion = ind

    def niches(self) -> list[Individual]:
        """Quality diversity (MAP-Elites' cells): the fastest PASS of each block shape (the
        values of the tunables the task declares legal), fastest cell first."""
        best: dict[tuple, Individual] = {}
        for ind in self.taken:
            if ind.passed:
                cell = self.cell(ind)
                if cell not in best or ind.merit > best[cell].merit:
                    best[cell] = ind
        return sorted(best.values(), key=lambda ind: -ind.merit)

    def cell(self, ind: Individual) -> tuple:
        if ind.id not in self.cells:
            values = block_values(ind.source, self.task)
            self.cells[ind.id] = tuple(values.get(name) for name in self.cell_tunables)
        return self.cells[ind.id]

    def pool(self) -> list[Individual]:
        """The population selection draws from: the hall of fame, the elites of the next-best
        block shapes (up to ``niches`` of them: a shape whose first steps do not pay yet stays in
        reach), then the latest items taken in."""
        s = self.config.search
        elites = list(self.hof)
        ids, cells = {e.id for e in elites}, {self.cell(e) for e in elites}
        for ind in self.niches():
            if len(elites) >= s.hall_of_fame + s.niches:
                break
            if ind.id not in ids and self.cell(ind) not in cells:
                elites.append(ind)
                ids.add(ind.id)
                cells.add(self.cell(ind))
        rest = [ind for ind in self.taken if ind.id not in ids and (ind.passed or not s.passed_parents)]
        room = s.population - len(elites)
        return elites + (rest[-room:] if room > 0 else [])

    def cut(self) -> int | None:
        """The cascade's cut for a child bred now: prune_factor x the champion's cycles."""
        factor = self.config.search.prune_factor
        best = self.champion.result.metrics.estimated_cycles if self.champion else None
        return int(best * factor) if factor and best else None

    # -- breeding -----------------------------------------------------------------------------------
    def fit_key(self, ind: Individual) -> str:
        """``ind``'s source with every fit-only setting made one value (its VMEM limit the largest):
        kernels with one key have one figure under the compiler estimate."""
        if ind.id not in self.keys:
            source = ind.source
            for op in self.fit_ops:
                source = op.fit_key(source, self.task)
            self.keys[ind.id] = source
        return self.keys[ind.id]

    def new(self, ind: Individual | None) -> bool:
        """Whether ``ind`` is a kernel the run has not bred, nor one that differs from a bred one
        only in what decides whether it fits (a repair is bred apart: it is exactly that)."""
        return ind is not None and ind.id not in self.seen and \
            (not self.fit_ops or self.fit_key(ind) not in self.fits)

    def bred(self, ind: Individual) -> Individual:
        self.seen.add(ind.id)
        if self.fit_ops:
            self.fits.add(self.fit_key(ind))
        return ind

    def initial_population(self) -> list[Individual]:
        rng = random.Random(item_rng(self.config.search.rng_seed, 0))
        seed = Individual(self.seed_source, edits=[], generation=0)
        self.seen, self.fits = set(), set()
        population = [self.bred(seed)]
        # The first population covers the block shapes (each with, mostly, a chain of other
        # operators that covers them all); random moves from the seed only fill what is left.
        for child in block_shapes(seed, self.task, rng, self.config.search.population - 1,
                                  max_chain=self.config.search.max_chain,
                                  operators=self.operators, stacked=self.config.search.stacked):
            if self.new(child):
                population.append(self.bred(child))
        tries = 0
        while len(population) < self.config.search.population and tries < 10 * self.config.search.population:
            tries += 1
            child = self.toolbox.mutate(seed, rng=rng, generation=0,
                                        max_chain=self.config.search.max_chain)
            if self.new(child):
                population.append(self.bred(child))
        return population

    def repair(self, generation: int) -> Individual | None:
        """The oldest failed child an operator repairs, repaired (None when none is left)."""
        while self.repairs:
            failed = self.repairs.pop(0)
            for op in self.operators:
                if failed.result.status.value not in op.repairs:
                    continue
                params = op.repair_params(failed.source, self.task, failed.result.error or "")
                result = op.apply_params(failed.source, self.task, params) if params is not None else None
                if result is None or not result.applied:
                    continue
                child = Individual(result.source, edits=failed.edits + [result.edit.to_dict()],
                                   parent_ids=(failed.id,), operator=op.name, params=dict(result.edit.params),
                                   generation=generation)
                if child.id not in self.seen:
                    return child
        return None

    def walked(self) -> list[Individual]:
        """The kernels the local search walks, in turn: the champion every other step, and between
        its steps the best kernel of each of the next ``niches`` block shapes in turn. A second
        shape whose stacked kernel is one step from the best (2048-wide blocks whose minor block
        is still 2048) is walked too, not only drawn by tournaments it rarely wins; but only a
        shape within ``walk_within`` x the champion's figure: one step rarely closes a wider gap,
        and the champion's own steps are the ones that can still pay (its turns, instead)."""
        others = [ind for ind in self.niches() if self.cell(ind) != self.cell(self.champion)]
        within = self.config.search.walk_within
        if within:
            others = [ind for ind in others if ind.merit * within >= self.champion.merit]   # a speedup
        others = others[:self.config.search.niches]
        turn, self.turns = self.turns, self.turns + 1
        first = others[(turn // 2) % len(others)] if others and turn % 2 else self.champion
        return [first] + [ind for ind in [self.champion] + others if ind is not first]

    def moves(self, walked: Individual) -> list[tuple]:
        """A walked kernel's one-step moves: the champion's, every edit dropped and every knob
        moved; another shape's best, its block shape moved a step (to a neighbouring cell: what
        the cell's best would be at the next size up or down of one block)."""
        shaper = {op.name: op for op in self.operators if op.sets_shape}
        tied = [("tweak", i, params) for i, e in enumerate(walked.edits) if e["op"] in shaper
                for params in tied_steps(shaper[e["op"]], e.get("params") or {},
                                         replay_applicable(self.seed_source, walked.edits[:i], self.task)[0],
                                         self.task)]
        if walked is self.champion:
            return [("drop", i, None) for i in range(len(walked.edits))] + \
                [("tweak", i, None) for i in knobs(walked)] + tied
        return [("tweak", i, None) for i in knobs(walked) if walked.edits[i]["op"] in shaper] + tied

    def local(self, rng: random.Random, generation: int) -> Individual | None:
        """The local search's step: one of a walked kernel's one-step neighbours (an edit dropped,
        or a parameter moved to its nearest other value) not judged yet, drawn by what the
        operators' paired trials say (a drop by how seldom its operator has paid, a tweak by how
        often): a multi-step kernel found with a random parameter or with an edit that costs (a
        stacked first kernel) is walked to its local optimum, whatever tournaments draw. Each
        kernel's moves are drawn without replacement and built only when drawn; the kernel whose
        turn it is (:meth:`walked`) first, the others when its moves are spent. Once the surrogate
        has data, the move is the one it ranks fastest of up to ``oversample`` drawn (the others
        go back to be drawn): of a block shape's or a strip's two neighbours, the run's figures so
        far say which side pays."""
        weights = self.weights() or {}
        s = self.config.search
        want = s.oversample if s.ranked_local and self.surrogate.ready else 1
        for walked in self.walked():
            moves = self.near.setdefault((walked is self.champion, walked.id), self.moves(walked))
            drawn: list[tuple[Individual, tuple]] = []
            while moves and len(drawn) < want:
                chance = [(drop_chance if kind == "drop" else tweak_chance)(walked.edits[i]["op"], weights)
                          for kind, i, _ in moves]
                move = moves.pop(rng.choices(range(len(moves)), weights=chance, k=1)[0])
                kind, i, params = move
                if kind == "tweak" and params is None:     # its nearest values, each a move of its own
                    moves += [("tweak", i, p) for p in nearest(walked, i, self.seed_source, self.task, rng)]
                    continue
                child = dropped(walked, i, self.seed_source, self.task, generation) if kind == "drop" else \
                    tweaked(walked, i, params, self.seed_source, self.task, generation)
                if self.new(child) and child.id not in {c.id for c, _ in drawn}:
                    drawn.append((child, move))
            if drawn:      # the surrogate keeps the move it ranks fastest; the others stay to be drawn
                best = self.fastest([child for child, _ in drawn])
                moves += [move for k, (_, move) in enumerate(drawn) if k != best]
                return drawn[best][0]
        return None

    def fastest(self, children: list[Individual]) -> int:
        """The index of the child the surrogate ranks fastest (ties: the first bred); one: 0."""
        return min(range(len(children)), key=lambda i: (self.surrogate.predict(children[i].source,
                                                                                children[i].edits), i)) \
            if len(children) > 1 else 0

    def breed_one(self, index: int, generation: int) -> Individual | None:
        """Item ``index``: a repair of a child that failed in a way an operator repairs, else a
        new child of the pool as it stands; None if none new was found."""
        s = self.config.search
        repaired = self.repair(generation)
        if repaired is not None:
            repaired.cut = self.cut()
            return self.bred(repaired)
        state = item_rng(s.rng_seed, index)
        rng = random.Random(state)
        random.seed(state)   # DEAP's selection draws from the global generator
        if self.champion is not None and rng.random() < s.local_prob:
            child = self.local(rng, generation)
            if child is not None:
                child.cut = self.cut()
                return self.bred(child)
        pool, weights = self.pool(), self.weights()
        if not pool:         # nothing passed (parents must have): no parent; the loop waits for a verdict
            return None
        want = s.oversample if self.surrogate.ready else 1
        candidates: list[Individual] = []
        for _ in range(want):
            for _ in range(s.max_tries):
                first, second = self.toolbox.select(pool, 2)
                draw = rng.random()
                if draw < s.crossover_prob:
                    child = self.toolbox.mate(first, second, rng=rng, generation=generation)
                elif draw < s.crossover_prob + s.drop_prob:
                    child = self.toolbox.drop(first, rng=rng, generation=generation,
                                              weights=weights if s.weighted_drop else None)
                elif draw < s.crossover_prob + s.drop_prob + s.tweak_prob:
                    child = self.toolbox.tweak(first, rng=rng, generation=generation, weights=weights)
                else:
                    child = self.toolbox.mutate(first, rng=rng, generation=generation,
                                                max_chain=s.max_chain, weights=weights)
                if self.new(child) and child.id not in {c.id for c in candidates}:
                    candidates.append(child)
                    break
        if not candidates:
            return None
        child = candidates[self.fastest(candidates)]
        child.cut = self.cut()
        return self.bred(child)

    # -- the loop -----------------------------------------------------------------------------------
    def run(self, executor) -> Individual | None:
        """Judge the first population and children up to the configured total, through
        ``executor``, keeping every worker busy; returns the champion."""
        s = self.config.search
        total = s.total()
        items: list[Individual | None] = list(self.initial_population())[:total]
        n0, per_generation = len(items), s.population - s.hall_of_fame
        total = max(total, n0)
        ends = {min(n0 - 1 + g * per_generation, total - 1): g
                for g in range(1 + -(-(total - n0) // per_generation))}   # last index -> generation
        pending: dict[concurrent.futures.Future, int] = {}
        done: dict[int, Any] = {}
        for i, ind in enumerate(items):
            pending[executor.submit(self.toolbox.evaluate, ind)] = i
        taken = 0

        def breed_ready() -> None:
            # Child i is bred right after item i - lag is taken in (and never before the seed
            # is), never later: what it sees does not depend on which other results are ready.
            # While nothing has passed, a child that cannot be bred waits for the next verdict;
            # once every kernel bred is taken in and none passed, the run stops there.
            nonlocal total
            while len(items) < total and taken >= 1 and len(items) <= taken + s.lag - 1:
                i = len(items)
                child = self.breed_one(i, 1 + (i - n0) // per_generation)
                if child is None and self.champion is None:
                    if taken == len(items):
                        total = taken
                        self.stopped = 0 if taken <= n0 else 1 + (taken - 1 - n0) // per_generation
                        if taken - 1 not in ends:
                            self._close_generation(self.stopped)
                    return
                items.append(child)
                if child is None:
                    done[i] = None
                else:
                    pending[executor.submit(self.toolbox.evaluate, child)] = i

        breed_ready()
        while taken < total:
            while taken in done:           # results are taken in strictly in index order
                ind, outcome = items[taken], done.pop(taken)
                if ind is not None:
                    self.toolbox.record(ind, outcome)
                    self.record([ind])
                    self.taken.append(ind)
                if taken in ends:
                    self._close_generation(ends[taken])
                taken += 1
                breed_ready()
            if taken >= total:
                break
            finished, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in finished:
                done[pending.pop(future)] = future.result()
        return self.champion

    def _close_generation(self, generation: int) -> None:
        pool = self.pool()
        self.logbook.record(gen=generation, evals=len(self.taken), **self.stats.compile(pool))
        self.on_generation(generation, pool, self)
