"""A trusted static audit of an exported program: what the compiler's estimate cannot count.

Run by the trusted runner on the programs a jailed worker exported (never on anything the
worker says about them). libtpu's static estimate simulates the kernel's scalar control flow
with no knowledge of data, so it miscounts (see the README's table, and
``scripts/estimator_constructs.py`` which measures it):

* loops whose trip count depends on data (``scf.while``; ``scf.for`` whose bounds come from a
  load, e.g. a scalar-prefetch value): counted as a fixed guess whatever the real count;
* branches on loaded data (``pl.when`` on a prefetched flag or a value read from a ref);
* XLA loops and branches around the kernel (``stablehlo.while`` / ``case`` / ``if``): a loop
  body is counted once;
* host callbacks and unknown custom calls: work the TPU never sees.

Control flow on program ids and constants (``pl.when(kv_index == 0)``, causal block skipping)
is simulated exactly and is not flagged. Each finding names the construct and where it is.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re

# Custom calls of the outer TPU program that are benign: the kernel itself, and sharding marks.
_BENIGN_TARGETS = {"tpu_custom_call", "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"}
_TARGET_RE = re.compile(r"stablehlo\.custom_call @([\w.]+)|call_target_name = \"([\w.]+)\"")
_BACKEND_RE = re.compile(r'backend_config = "((?:[^"\\]|\\.)*)"')
_XLA_CONTROL = {"stablehlo.while": "xla_loop", "stablehlo.case": "xla_branch", "stablehlo.if": "xla_branch"}


@dataclasses.dataclass(frozen=True)
class Finding:
    construct: str   # data_dependent_loop, data_dependent_branch, xla_loop, xla_branch, host_callback,
    #                  unknown_custom_call, effects, multi_platform, unparsed_kernel
    where: str
    detail: str


def audit_exported(exported) -> list[Finding]:
    """Every construct in ``exported`` (a ``jax.export.Exported``) the estimate cannot count."""
    findings: list[Finding] = []
    platform = tuple(exported.platforms)
    if len(platform) != 1:
        findings.append(Finding("multi_platform", "exported program",
                                f"exported for {platform}: one program per platform is required"))
    effects = tuple(exported.ordered_effects) + tuple(exported.unordered_effects)
    if effects:
        findings.append(Finding("effects", "exported program",
                                f"side effects {', '.join(map(str, effects))}: a kernel must be pure"))
    text = exported.mlir_module()
    for match in _TARGET_RE.finditer(text):
        target = match.group(1) or match.group(2)
        if target in _BENIGN_TARGETS and (target != "tpu_custom_call" or platform == ("tpu",)):
            continue
        kind = "host_callback" if "callback" in target.lower() else "unknown_custom_call"
        findings.append(Finding(kind, f"{platform[0]} program: custom call '{target}'",
                                "work outside the compiled kernel that no TPU estimate sees"))
    if platform == ("tpu",):
        for op, construct in _XLA_CONTROL.items():
            count = len(re.findall(rf"\b{re.escape(op)}\b", text))
            if count:
                findings.append(Finding(construct, f"outer program: {op} (x{count})",
                                        "XLA control flow around the kernel: the estimate counts a "
                                        "loop body once and cannot know which branch runs"))
        for body in _mosaic_bodies(text):
            findings.extend(_audit_mosaic(body))
    return list(dict.fromkeys(findings))   # one line per construct and place


def _mosaic_bodies(text: str) -> list[bytes | None]:
    bodies: list[bytes | None] = []
    for raw in _BACKEND_RE.findall(text):
        try:
            config = json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), raw))
            bodies.append(base64.b64decode(config["custom_call_config"]["body"]))
        except (ValueError, KeyError, TypeError):
            bodies.append(None)
    return bodies


def _audit_mosaic(body: bytes | None) -> list[Finding]:
    from jax._src.lib.mlir import ir
    from jax._src.tpu_custom_call import tpu

    if body is None:
        return [Finding("unparsed_kernel", "kernel", "its Mosaic body could not be decoded")]
    ctx = ir.Context()
    tpu.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True
    try:
        with ctx:
            module = ir.Module.parse(body)
            return _scan(module)
    except Exception as exc:  # noqa: BLE001 - an unreadable kernel is a finding, not a crash
        return [Finding("unparsed_kernel", "kernel", f"its Mosaic body could not be parsed: {exc}")]


def _short(name: str) -> str:
    """``stable_mosaic.scf.if`` -> ``scf.if`` (the serialized form carries a version prefix)."""
    parts = name.split(".")
    return ".".join(parts[-2:])


def _walk(operation):
    for region in operation.regions:
        for block in region.blocks:
            for op in block.operations:
                yield op
                yield from _walk(op.operation)


def _reads_data(value, seen: set) -> bool:
    """Does ``value`` depend on anything loaded from memory (a ref, scalar prefetch, SMEM)?"""
    from jax._src.lib.mlir import ir

    owner = value.owner
    if isinstance(owner, ir.Block):
        return False   # a block argument: a grid index, or a static loop's induction variable
    op = owner.operation
    if op in seen:
        return False
    seen.add(op)
    if "load" in _short(op.name).split(".")[-1]:
        return True
    if any("load" in _short(inner.operation.name).split(".")[-1] for inner in _walk(op)):
        return True   # a region (an scf.if's yield, say) that reads memory
    return any(_reads_data(operand, seen) for operand in op.operands)


def _scan(module) -> list[Finding]:
    findings: list[Finding] = []
    for op in _walk(module.operation):
        op = op.operation
        name = _short(op.name)
        if name == "scf.while":
            findings.append(Finding("data_dependent_loop", "kernel (Mosaic): scf.while",
                                    "a while loop: the estimate cannot know its trip count"))
        elif name == "scf.for" and any(_reads_data(v, set()) for v in list(op.operands)[:3]):
            findings.append(Finding("data_dependent_loop", "kernel (Mosaic): scf.for",
                                    "a loop whose bounds are loaded from memory (e.g. a scalar-prefetch "
                                    "value): the estimate counts a guess, not the real trip count"))
        elif name == "scf.if" and _reads_data(op.operands[0], set()):
            findings.append(Finding("data_dependent_branch", "kernel (Mosaic): scf.if",
                                    "a branch on data loaded from memory (e.g. pl.when on a prefetched "
                                    "flag): the estimate cannot know which way it goes"))
    return findings
