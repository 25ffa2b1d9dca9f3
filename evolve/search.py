"""The evolutionary loop: DEAP's toolbox, tournament selection, a hall of fame as the ratchet.

    population <- seed + distinct block shapes (some with more edits) + mutants of the seed
                  (chains of 1..max_chain edits); evaluate
    for each generation:
        elites   <- the hall of fame (the best PASS ever seen; never lost)
        parents  <- tournament selection from the population
        children <- crossover (replay two edit histories) or mutation (a chain of operators, drawn
                    by what has paid so far), oversample x as many as needed, ranked by the
                    surrogate (evolve/surrogate.py) once it has data; the best ranked are kept
        evaluate children (archive first: a source already judged is never judged again)
        population <- elites + children

Everything the search learns (the surrogate, the operators' payoff) comes from verdicts of
earlier generations only, so a configuration and an RNG seed give one run.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from deap import base, tools

from evolve.config import RunConfig
from evolve.individual import Individual
from evolve.surrogate import Surrogate
from evolve.variation import block_shapes, crossover, mutate
from mutations import operator_names

SURROGATE_TUNABLES = ["BLOCK_Q", "BLOCK_KV", "HEADS_PER_PROGRAM", "DIAGONAL_STRIP", "VMEM_LIMIT_BYTES"]


def generation_rng(rng_seed: int, generation: int) -> str:
    """The RNG state of a generation, as a seed string: resuming at a generation replays it."""
    return f"pallas-evolve:{rng_seed}:{generation}"


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
    return (challenger.speedup or 0.0) > (champion.speedup or 0.0)


def make_toolbox(config: RunConfig, seed_source: str, task, *, evaluate: Callable, map_fn: Callable,
                 record: Callable) -> base.Toolbox:
    """``evaluate(ind) -> outcome`` judges one individual; ``map_fn`` is where parallel, sandboxed
    evaluation plugs in; ``record(ind, outcome)`` sets its result and fitness and logs it."""
    toolbox = base.Toolbox()
    toolbox.register("mutate", mutate, seed_source=seed_source, task=task)
    toolbox.register("mate", crossover, seed_source=seed_source, task=task)
    toolbox.register("select", tools.selTournament, tournsize=config.search.tournament_size)
    toolbox.register("evaluate", evaluate)
    toolbox.register("map", map_fn)
    toolbox.register("record", record)
    return toolbox


class Search:
    """Holds the state of one run's search; the toolbox's ``map`` and ``evaluate`` judge."""

    def __init__(self, config: RunConfig, seed_source: str, task, *, evaluate: Callable, map_fn: Callable,
                 record: Callable, on_generation: Callable[[int, list[Individual], Search], None]):
        self.config = config
        self.seed_source = seed_source
        self.task = task
        self.toolbox = make_toolbox(config, seed_source, task, evaluate=evaluate, map_fn=map_fn, record=record)
        self.on_generation = on_generation
        self.hof = tools.HallOfFame(config.search.hall_of_fame, similar=lambda a, b: a.id == b.id)
        self.champion: Individual | None = None
        self.seen: set[str] = set()
        self.surrogate = Surrogate(operator_names(), SURROGATE_TUNABLES)
        self.credit: dict[str, list[int]] = {}        # operator -> [tries, wins over the parent]
        self.speedups: dict[str, float] = {}          # individual id -> speedup (PASS only)
        self.learned: set[str] = set()

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
                self.speedups[ind.id] = ind.speedup or 0.0
            if ind.operator in ("seed", "crossover") or not ind.parent_ids:
                continue
            parent = self.speedups.get(ind.parent_ids[0])
            won = ind.passed and parent is not None and (ind.speedup or 0.0) > parent
            for op in ind.operator.split("+"):
                tries, wins = self.credit.get(op, [0, 0])
                self.credit[op] = [tries + 1, wins + int(won)]

    # -- generation 0 ---------------------------------------------------------------------------
    def initial_population(self) -> list[Individual]:
        rng = random.Random(generation_rng(self.config.search.rng_seed, 0))
        seed = Individual(self.seed_source, edits=[], generation=0)
        population, self.seen = [seed], {seed.id}
        # Half the first population covers the block shapes; the rest are random moves.
        for child in block_shapes(seed, self.task, rng, (self.config.search.population - 1) // 2,
                                  max_chain=self.config.search.max_chain):
            if child.id not in self.seen:
                self.seen.add(child.id)
                population.append(child)
        tries = 0
        while len(population) < self.config.search.population and tries < 10 * self.config.search.population:
            tries += 1
            child = self.toolbox.mutate(seed, rng=rng, generation=0,
                                        max_chain=self.config.search.max_chain)
            if child is not None and child.id not in self.seen:
                self.seen.add(child.id)
                population.append(child)
        return population

    def record(self, population: list[Individual]) -> None:
        self.learn(population)
        passed = [ind for ind in population if ind.passed]
        self.hof.update(passed)
        for ind in passed:
            if beats(ind, self.champion):
                self.champion = ind

    # -- one generation ---------------------------------------------------------------------------
    def breed(self, population: list[Individual], generation: int) -> list[Individual]:
        state = generation_rng(self.config.search.rng_seed, generation)
        rng = random.Random(state)
        random.seed(state)   # DEAP's selection draws from the global generator
        elites = list(self.hof)
        k = self.config.search.population - len(elites)
        wanted = k * (self.config.search.oversample if self.surrogate.ready else 1)
        parents = self.toolbox.select(population, k)
        weights = self.weights()
        children: list[Individual] = []
        for n in range(wanted):
            parent = parents[n % len(parents)]
            for _ in range(self.config.search.max_tries):
                if rng.random() < self.config.search.crossover_prob:
                    other = rng.choice(parents)
                    child = self.toolbox.mate(parent, other, rng=rng, generation=generation)
                else:
                    child = self.toolbox.mutate(parent, rng=rng, generation=generation,
                                                max_chain=self.config.search.max_chain, weights=weights)
                if child is not None and child.id not in self.seen and \
                        child.id not in {c.id for c in children}:
                    children.append(child)
                    break
        if len(children) > k:     # the surrogate keeps the k children it ranks fastest
            ranked = sorted(range(len(children)),
                            key=lambda i: (self.surrogate.predict(children[i].source, children[i].edits), i))
            children = [children[i] for i in sorted(ranked[:k])]
        self.seen.update(c.id for c in children)
        return elites, children

    def evaluate(self, individuals: list[Individual]) -> None:
        for ind, outcome in zip(individuals, self.toolbox.map(self.toolbox.evaluate, individuals)):
            self.toolbox.record(ind, outcome)

    def run(self, population: list[Individual], start: int = 0) -> Individual | None:
        """Evaluate ``population`` as generation ``start`` and go on to the last generation."""
        self.seen.update(ind.id for ind in population)
        self.evaluate(population)
        self.record(population)
        self.on_generation(start, population, self)
        return self.evolve(population, start + 1)

    def evolve(self, population: list[Individual], first: int) -> Individual | None:
        """Generations ``first``..last, starting from an evaluated ``population``."""
        for generation in range(first, self.config.search.generations + 1):
            elites, children = self.breed(population, generation)
            self.evaluate(children)
            self.record(children)
            population = elites + children
            self.on_generation(generation, population, self)
        return self.champion
