"""A trusted static audit of an exported program: what the compiler's static estimate cannot count.

Run by the trusted runner on the programs a jailed worker exported (never on anything the worker
says about them); it reads only the serialized program, so it is as trustworthy as the parser.

libtpu's static estimate (``--xla_jf_dump_static_llo_profile_to``) simulates a kernel's scalar
control flow with no knowledge of the data, so it miscounts whatever depends on data
(``scripts/estimator_constructs.py`` measures by how much; libtpu 0.0.42.1, v5e):

* **In a Mosaic kernel** (the ``tpu_custom_call`` body of each ``pallas_call``):

  - ``scf.for`` whose lower bound, upper bound or step is not computed from constants and the
    kernel's grid indices alone (e.g. ``fori_loop(0, n_ref[0], ...)`` on a scalar-prefetch
    value): counted as a fixed guess (30-40-odd trips) whatever the real count;
  - ``scf.while`` (``lax.while_loop``) whose exit condition depends on data. A while loop whose
    condition is computed from constants and grid indices (a counter up to a constant) is
    simulated exactly (measured: same cycles as the equivalent ``fori_loop``): not flagged;
  - ``scf.if`` / ``scf.index_switch`` / ``cf.cond_br`` / ``cf.switch`` whose condition depends
    on memory (any op that reads a ref: ``memref.load`` of a scalar-prefetch/SMEM value,
    ``vector.load`` of a VMEM block, ``tpu.sem_read``, ...) or on a runtime-only value
    (``tpu.prng_random_bits``, ``tpu.device_id``...): an always-true ``pl.when`` on a prefetched
    flag was counted as about two thirds of the unconditional kernel;
  - a grid dimension with a dynamic bound.

  Control flow on program ids and constants (``pl.when(kv_index == 0)``, causal block skipping
  ``pl.when(kv_start <= q_end)``, a ``fori_loop`` bounded by a grid index, ``lax.switch`` on a
  program id) is what the estimate simulates exactly: not flagged. The analysis is
  deny-by-default: a scalar is trusted only if every op in its backward slice (through loop-carried
  values and the values ``scf.if`` yields) is a constant, a grid index, the induction variable of a
  trusted loop, or a side-effect-free op with no ref operand (arith, math, vector, pure tpu ops).

* **In the outer program** (the StableHLO around the kernels): ``stablehlo.while`` (XLA loops: a
  body is counted once), ``stablehlo.case`` / ``stablehlo.if`` (XLA branches),
  ``stablehlo.send/recv/infeed/outfeed`` (how host callbacks reach a TPU) and custom calls other
  than the kernel itself and sharding annotations (on CPU, host callbacks are custom calls);
  effects; an export for more than one platform.

A CPU program (the Pallas HLO interpreter: its grid is an XLA while loop) is audited for host
work, effects and platforms only; its loops are the interpreter's, not the candidate's.

What ``jax.export`` does by itself (jax 0.10.2): it refuses to export any host callback
(``pure_callback``, ``io_callback``, ``jax.debug.print``): ``NotImplementedError: serialization of
host_callbacks is not yet implemented`` for CPU, and for TPU on a host without a TPU backend
``ValueError: the platform for the specified backend cpu is different from the lowering platform
tpu``; it also refuses custom calls outside its stable list unless a ``DisabledSafetyCheck`` is
passed. A hostile worker is not bound by any of that (it can build an ``Exported`` around any
module), so those are checked here again.

Limits: a branch on a value the kernel itself stored to scratch and read back (e.g. a counter in
SMEM scratch) is flagged even when it is a pure function of the grid indices (false positive);
data-dependent *addresses* (a scalar-prefetch block index in an index map, a dynamic slice) are
not flagged: the estimate's DMA and load costs do not depend on where the data is.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import re

# Custom calls of the outer TPU program that do no work the estimate could miss: the kernel itself,
# and sharding annotations (`with_sharding_constraint`, `shard_map` boundaries; a no-op on one
# device; under Shardy they are `sdy.*` ops, not custom calls). JAX's own Pallas flash attention and
# a plain XLA attention (`jax.nn.dot_product_attention`) export with no other custom call.
_BENIGN_TARGETS = {
    "tpu": {"tpu_custom_call", "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"},
    "cpu": {"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"},
}
_HOST_TRANSFER_OPS = {"stablehlo.send", "stablehlo.recv", "stablehlo.infeed", "stablehlo.outfeed"}
_XLA_CONTROL = {"stablehlo.while": "xla_loop", "stablehlo.case": "xla_branch",
                "stablehlo.if": "xla_branch"}
# The constructs whose work the trusted runner counts on the timing input instead of refusing
# the figure (``trips.py``), when it has an interpreted run to count them in.
COUNTED_ON_DATA = ("data_dependent_loop", "data_dependent_branch")

_DETAILS = {
    "xla_loop": "an XLA loop around the kernel: the static estimate counts its body once, "
                "whatever the trip count",
    "xla_branch": "an XLA branch around the kernel: the static estimate cannot know which branch runs",
    "host_callback": "work handed to the host (a callback or host transfer): the TPU estimate never sees it",
    "unknown_custom_call": "a custom call that is neither a Pallas kernel nor a sharding annotation: "
                           "the estimate cannot say what it costs",
    "while": "a while loop whose exit condition depends on data: its trip count is unknown at compile "
             "time, so the static estimate counts a guess",
    "for": "a loop whose bounds are not computed from constants and grid indices alone (e.g. a "
           "scalar-prefetch value): the static estimate counts a guess, not the real trip count",
    "branch": "a branch on data (a value loaded from a ref, e.g. pl.when on a prefetched flag): the "
              "static estimate cannot know which way it goes",
}
_DYNAMIC = -(2 ** 63)   # MLIR's ShapedType::kDynamic, Pallas' marker of a dynamic grid dimension

# Ops with no operands whose result is known at compile time. Any other operand-less op
# (tpu.prng_random_bits, tpu.device_id, tpu.core_id, ...) yields a runtime value.
_CONSTANT_OPS = {"arith.constant", "tpu.iota", "vector.step", "vector.constant_mask", "ub.poison",
                 "tpu.iteration_bound"}
# Ops that yield runtime values although their operands may be trusted.
_RUNTIME_OPS = {"tpu.prng_random_bits", "tpu.prng_set_seed_32", "tpu.sem_read", "tpu.device_id",
                "tpu.core_id", "tpu.subcore_id", "tpu.fetch_and_add_sync", "func.call"}


@dataclasses.dataclass(frozen=True)
class Finding:
    construct: str   # data_dependent_loop, data_dependent_branch, xla_loop, xla_branch, host_callback,
    #                  unknown_custom_call, effects, multi_platform, unparsed_kernel
    where: str       # e.g. "kernel 'flash_attention' (Mosaic): scf.while at kernel.py:42"
    detail: str      # one line for a user: what it is, and why the estimate cannot count it


def audit_exported(exported) -> list[Finding]:
    """Every construct in ``exported`` (a ``jax.export.Exported``) the static estimate cannot count.

    Never raises on a malformed program: what cannot be read is itself a finding.
    """
    findings: list[Finding] = []
    platforms = tuple(exported.platforms)
    if len(platforms) != 1:
        findings.append(Finding("multi_platform", "exported program",
                                f"exported for platforms {platforms}: the program checked and the "
                                "program timed must be one program for one platform"))
    effects = tuple(exported.ordered_effects) + tuple(exported.unordered_effects)
    if effects:
        findings.append(Finding("effects", "exported program",
                                f"side effects ({', '.join(map(str, effects))}): a kernel must be a "
                                "pure function of its inputs"))
    platform = platforms[0] if len(platforms) == 1 else "tpu"
    try:
        findings.extend(_audit_outer(exported.mlir_module_serialized, platform))
    except Exception as exc:  # noqa: BLE001 - an unreadable program is a finding, not a crash
        findings.append(Finding("unparsed_kernel", "outer program",
                                f"the exported program could not be read: {_one_line(exc)}"))
    return _merge(findings)


def _clean(name: str) -> str:
    """A name the candidate chose (kernel name, custom call target), safe to put in a message."""
    return re.sub(r"[^\w.\-<>]", "_", name)[:80] or "?"


def _one_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _merge(findings: list[Finding]) -> list[Finding]:
    """One finding per construct and place, with a count when a place repeats it."""
    counts: dict[Finding, int] = {}
    for f in findings:
        counts[f] = counts.get(f, 0) + 1
    return [f if n == 1 else dataclasses.replace(f, where=f"{f.where} (x{n})")
            for f, n in counts.items()]


def walk_ops(op):
    """Every op nested in ``op`` (not ``op`` itself), in program order."""
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                child = child.operation
                yield child
                yield from walk_ops(child)


def _string_attr(op, name: str) -> str | None:
    from jaxlib.mlir import ir

    if name not in op.attributes:
        return None
    attr = op.attributes[name]
    return attr.value if isinstance(attr, ir.StringAttr) else None


def _audit_outer(serialized: bytes, platform: str) -> list[Finding]:
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax

    findings: list[Finding] = []
    kernels: list[tuple[str, str | None]] = []
    with mlir.make_ir_context():
        module = _jax.mlir.deserialize_portable_artifact(serialized)
        for op in walk_ops(module.operation):
            name = op.name
            if name in _XLA_CONTROL and platform == "tpu":
                construct = _XLA_CONTROL[name]
                findings.append(Finding(construct, f"outer program: {name}", _DETAILS[construct]))
            elif name in _HOST_TRANSFER_OPS:
                findings.append(Finding("host_callback", f"{platform} program: {name}",
                                        _DETAILS["host_callback"]))
            elif name == "stablehlo.custom_call":
                target = _string_attr(op, "call_target_name") or ""
                if target == "tpu_custom_call" and platform == "tpu":
                    kernel = _clean(_string_attr(op, "kernel_name") or "")
                    kernels.append((kernel, _string_attr(op, "backend_config")))
                elif target not in _BENIGN_TARGETS.get(platform, set()):
                    construct = "host_callback" if "callback" in target.lower() else "unknown_custom_call"
                    findings.append(Finding(construct, f"{platform} program: custom call '{_clean(target)}'",
                                            _DETAILS[construct]))
    for kernel, config in kernels:
        findings.extend(_audit_kernel(kernel, config))
    return findings


def _audit_kernel(kernel: str, config: str | None) -> list[Finding]:
    where = f"kernel '{kernel}' (Mosaic)"
    try:
        with mosaic_module(config) as module:
            return _KernelScan(where).scan(module)
    except KernelUnreadable as exc:
        return [Finding("unparsed_kernel", where, f"its Mosaic body {exc}")]
    except Exception as exc:  # noqa: BLE001 - an unreadable kernel is a finding, not a crash
        return [Finding("unparsed_kernel", where, f"its Mosaic body could not be parsed: {_one_line(exc)}")]


class KernelUnreadable(Exception):
    """A ``tpu_custom_call``'s Mosaic body could not be decoded or parsed."""


@contextlib.contextmanager
def mosaic_module(config: str | None):
    """The Mosaic module of a ``tpu_custom_call``'s backend_config, parsed into the real dialects
    (valid inside the ``with``: MLIR objects live as long as their context)."""
    try:
        if config is None:
            raise ValueError("no string backend_config")
        body = base64.b64decode(json.loads(config)["custom_call_config"]["body"], validate=True)
    except (ValueError, KeyError, TypeError) as exc:
        raise KernelUnreadable(f"could not be decoded: {_one_line(exc)}") from None
    from jax._src.interpreters import mlir
    from jax._src.lib import tpu
    from jaxlib.mlir import ir
    from jaxlib.mlir.passmanager import PassManager

    ctx = mlir.make_ir_context()
    tpu.register_dialect(ctx)
    with ctx, ir.Location.unknown():
        ctx.allow_unregistered_dialects = True   # the serialized form is versioned generic ops
        try:
            module = ir.Module.parse(body)
            # Upgrade the versioned "stable_mosaic.*" form to the real dialects, as libtpu does.
            PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(module.operation)
        except Exception as exc:  # noqa: BLE001
            raise KernelUnreadable(f"could not be parsed: {_one_line(exc)}") from None
        yield module


_FILE_LOC = re.compile(r'"(?:[^"\n]*/)?([\w.\-]{1,80})":(\d{1,7}):')


def _source(op) -> str:
    """`` at kernel.py:42`` from the op's location, if it names a file."""
    match = _FILE_LOC.search(str(op.location))
    return f" at {match.group(1)}:{match.group(2)}" if match else ""


def _terminator(block):
    """The last op of ``block`` (its terminator), or None for an empty block."""
    ops = list(block.operations)
    return ops[-1].operation if ops else None


def _is_ref(value) -> bool:
    """A ref (memref) or a semaphore: an operand through which an op reads memory."""
    from jaxlib.mlir import ir

    return isinstance(value.type, ir.MemRefType) or str(value.type).startswith("!tpu.")


class _KernelScan:
    """Taint analysis of one Mosaic module: which scalar values are known at compile time."""

    def __init__(self, where: str):
        self.where = where
        self.tainted: set = set()   # values that depend on data or runtime state
        self.changed = False

    def _taint(self, value) -> None:
        if value not in self.tainted:
            self.tainted.add(value)
            self.changed = True

    def _any_tainted(self, values) -> bool:
        return any(v in self.tainted for v in values)

    def _taint_all(self, op) -> None:
        """Every value ``op`` defines, in its results and in its bodies."""
        for r in op.results:
            self._taint(r)
        for region in op.regions:
            for block in region.blocks:
                for arg in block.arguments:
                    self._taint(arg)

    def scan(self, module) -> list[Finding]:
        funcs = [op.operation for op in module.body.operations if op.operation.name == "func.func"]
        main = next((f for f in funcs if "scalar_prefetch" in f.attributes), funcs[0] if funcs else None)
        findings: list[Finding] = []
        bounds: list[int] = []
        if main is not None and "iteration_bounds" in main.attributes:
            from jaxlib.mlir import ir

            bounds = list(ir.DenseI64ArrayAttr(main.attributes["iteration_bounds"]))
        for i, b in enumerate(bounds):
            if b == _DYNAMIC:
                findings.append(Finding("data_dependent_loop", f"{self.where}: grid dimension {i}",
                                        "a grid dimension whose size is only known at run time: the "
                                        "static estimate cannot count its iterations"))
        # Function arguments: the leading len(grid) scalars are the grid indices (main kernel and
        # index maps alike); everything else (scalar-prefetch refs, blocks, scratch) is a ref or,
        # if a scalar, untrusted.
        for func in funcs:
            for region in func.regions:
                for block in region.blocks:
                    for i, arg in enumerate(block.arguments):
                        if i >= len(bounds) or _is_ref(arg) or bounds[i] == _DYNAMIC:
                            self._taint(arg)
        # Propagate to a fixed point (loop-carried values may be tainted by a later iteration).
        self.changed = True
        while self.changed:
            self.changed = False
            for func in funcs:
                self._propagate(func)
        for func in funcs:
            for op in walk_ops(func):
                finding = self._check(op)
                if finding is not None:
                    findings.append(finding)
        return findings

    def _propagate(self, parent) -> None:
        for op in walk_ops(parent):
            name = op.name
            operands = list(op.operands)
            results = list(op.results)
            if name == "scf.for":
                body = op.regions[0].blocks[0]
                iv, carried = body.arguments[0], list(body.arguments)[1:]
                bounds_tainted = self._any_tainted(operands[:3])
                if bounds_tainted:
                    self._taint(iv)
                yields = list(body.operations)[-1].operation.operands if len(body.operations) else []
                for i, arg in enumerate(carried):
                    if (bounds_tainted or operands[3 + i] in self.tainted
                            or (i < len(yields) and yields[i] in self.tainted)):
                        self._taint(arg)
                        self._taint(results[i])
            elif name == "scf.while":
                before, after = (r.blocks[0] for r in op.regions)
                condition = _terminator(before)   # scf.condition(%cond) %forwarded...
                next_values = _terminator(after)  # scf.yield %next...
                if condition is None or next_values is None:
                    self._taint_all(op)
                    continue
                for i, arg in enumerate(before.arguments):
                    if operands[i] in self.tainted or next_values.operands[i] in self.tainted:
                        self._taint(arg)
                cond_tainted = condition.operands[0] in self.tainted
                forwarded = list(condition.operands)[1:]
                for i, (arg, r) in enumerate(zip(after.arguments, results)):
                    if cond_tainted or forwarded[i] in self.tainted:
                        self._taint(arg)
                        self._taint(r)
            elif name in ("scf.if", "scf.index_switch"):
                cond_tainted = operands[0] in self.tainted
                for region in op.regions:
                    for block in region.blocks:
                        if not len(block.operations):
                            continue
                        yields = list(block.operations)[-1].operation.operands
                        for i, r in enumerate(results):
                            if cond_tainted or (i < len(yields) and yields[i] in self.tainted):
                                self._taint(r)
            elif op.regions:
                # tpu.region and anything unknown with a body: its block arguments are untrusted; its
                # results are trusted only if its operands and every value it yields are.
                suspicious = self._any_tainted(operands)
                for region in op.regions:
                    for block in region.blocks:
                        if name != "tpu.region":
                            for arg in block.arguments:
                                self._taint(arg)
                        if len(block.operations) and self._any_tainted(
                                list(block.operations)[-1].operation.operands):
                            suspicious = True
                if suspicious:
                    for r in results:
                        self._taint(r)
            elif results:
                runtime = (name in _RUNTIME_OPS or any(_is_ref(v) for v in operands)
                           or (not operands and name not in _CONSTANT_OPS)
                           or self._any_tainted(operands))
                if runtime:
                    for r in results:
                        if not _is_ref(r):   # a view of a ref is a ref: reading it is what taints
                            self._taint(r)

    def _check(self, op) -> Finding | None:
        name = op.name
        operands = list(op.operands)
        if name == "scf.while":
            condition = _terminator(op.regions[0].blocks[0])
            if condition is None or condition.operands[0] in self.tainted:
                return Finding("data_dependent_loop", f"{self.where}: scf.while{_source(op)}", _DETAILS["while"])
            return None
        if name == "scf.for" and self._any_tainted(operands[:3]):
            return Finding("data_dependent_loop", f"{self.where}: scf.for{_source(op)}", _DETAILS["for"])
        if name in ("scf.if", "scf.index_switch", "cf.cond_br", "cf.switch") and operands \
                and operands[0] in self.tainted:
            return Finding("data_dependent_branch", f"{self.where}: {name}{_source(op)}", _DETAILS["branch"])
        return None
