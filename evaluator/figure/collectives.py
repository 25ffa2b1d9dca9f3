"""The collectives of a compiled multi-chip program, found in what the compiler wrote.

libtpu's static LLO profile (``--xla_jf_dump_static_llo_profile_to``) writes one
``<op>_static_llo_profile.textproto`` per HLO op; a collective's file says ``estimated_cycles: 0``
but carries the op's ``hlo_instruction`` (opcode, shape, element type, replica groups) and
``operand_shapes``: enough to know its bytes. An async ``collective-permute-start``/``-done`` pair
writes no file at all (libtpu 0.0.42.1, v5e:2x2), so the compiled HLO text is read too. What these
collectives cost is ``ici_model.py``'s business.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_OPCODE_RE = "|".join(re.escape(k) + sfx for k in COLLECTIVE_KINDS for sfx in ("-start", "-done", ""))


class NotModelled(Exception):
    """The model does not cover this collective; its cost is unknown, not zero."""


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str                    # one of COLLECTIVE_KINDS, or the unknown opcode as found
    op_name: str                 # the HLO instruction's name (the profile file's hlo_op_name)
    bytes: int                   # per-chip buffer: the result (all-gather: gathered; reduce-scatter: input)
    replica_groups: tuple[tuple[int, ...], ...] = ()  # () = every device
    source_target_pairs: tuple[tuple[int, int], ...] = ()
    jax_op: str = ""             # metadata.op_name, e.g. 'jit(f)/shard_map/psum'
    estimated_cycles: int = 0    # what the static profile said (0 for every collective seen so far)
    origin: str = "profile"      # 'profile' or 'hlo' (found only in the compiled HLO text)


@dataclasses.dataclass(frozen=True)
class Unmodelled:
    op_name: str
    kind: str
    reason: str


# ---------------------------------------------------------------- bytes of an XLA shape
_BITS = {"PRED": 8, "S8": 8, "U8": 8, "S16": 16, "U16": 16, "F16": 16, "BF16": 16, "S32": 32, "U32": 32,
         "F32": 32, "S64": 64, "U64": 64, "F64": 64, "C64": 64, "C128": 128, "S4": 4, "U4": 4, "S2": 2,
         "U2": 2, "F8E5M2": 8, "F8E4M3FN": 8, "F8E4M3B11FNUZ": 8, "F8E5M2FNUZ": 8, "F8E4M3FNUZ": 8,
         "F8E4M3": 8, "F8E3M4": 8, "F4E2M1FN": 4, "F8E8M0FNU": 8, "TOKEN": 0}


def array_bytes(dtype: str, dims: list[int], minor_to_major: list[int] | None = None,
                tile: list[int] | None = None) -> int:
    """Bytes of one array as laid out on the chip: the minor dims padded up to the first layout tile."""
    bits = _BITS.get(dtype.upper())
    if bits is None:
        raise NotModelled(f"element type {dtype} has no known size")
    phys = [dims[d] for d in reversed(minor_to_major)] if minor_to_major else list(dims)
    if tile:
        phys = [1] * max(0, len(tile) - len(phys)) + phys
        for i, t in enumerate(tile, start=len(phys) - len(tile)):
            if t > 0:
                phys[i] = -(-phys[i] // t) * t
    return -(-math.prod(phys) * bits // 8)


def _proto_shape_arrays(shape: dict) -> list[int]:
    if shape.get("element_type", ["?"])[0] == "TUPLE":
        return [b for sub in shape.get("tuple_shapes", []) for b in _proto_shape_arrays(sub)]
    layout = shape.get("layout", [{}])[0]
    tiles = layout.get("tiles", [])
    return [array_bytes(shape.get("element_type", ["?"])[0], [int(d) for d in shape.get("dimensions", [])],
                        [int(d) for d in layout.get("minor_to_major", [])] or None,
                        [int(d) for d in tiles[0].get("dimensions", [])] if tiles else None)]


# ---------------------------------------------------------------- textproto (just enough of it)
_TOKEN_RE = re.compile(r'\s+|#[^\n]*|("(?:[^"\\]|\\.)*")|([{}:<>])|([^\s{}:<>"]+)')


def parse_textproto(text: str) -> dict:
    """A protobuf text-format message as nested dicts: every field maps to a list of values."""
    tokens = [m.group(1) or m.group(2) or m.group(3) for m in _TOKEN_RE.finditer(text)
              if m.group(1) or m.group(2) or m.group(3)]
    pos = 0

    def message(end: str | None) -> dict:
        nonlocal pos
        out: dict[str, list] = {}
        while pos < len(tokens) and tokens[pos] != end:
            name = tokens[pos]
            pos += 1
            if tokens[pos] == ":":
                pos += 1
            if tokens[pos] in "{<":
                close = "}" if tokens[pos] == "{" else ">"
                pos += 1
                value: object = message(close)
            else:
                value = tokens[pos]
                if value.startswith('"'):
                    value = value[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
            pos += 1
            out.setdefault(name, []).append(value)
        return out

    return message(None)


def _proto_groups(device_list: dict) -> tuple[tuple[int, ...], ...]:
    groups = tuple(tuple(int(i) for i in g.get("replica_ids", [])) for g in device_list.get("replica_groups", []))
    for iota in device_list.get("iota_replica_group_list", []):
        groups += _iota_groups(int(iota["num_replica_groups"][0]), int(iota["num_devices_per_group"][0]),
                               [int(d) for d in iota.get("iota_reshape_dims", [])],
                               [int(p) for p in iota.get("iota_transpose_perm", [])])
    return groups


def _iota_groups(n_groups: int, per_group: int, dims: list[int], perm: list[int]) -> tuple[tuple[int, ...], ...]:
    import numpy as np
    ids = np.arange(n_groups * per_group).reshape(dims or [n_groups * per_group])
    ids = ids.transpose(perm or list(range(ids.ndim))).reshape(n_groups, per_group)
    return tuple(tuple(int(i) for i in row) for row in ids)


_INTERESTING_RE = re.compile(rf'opcode:\s*"({_OPCODE_RE})"|dma_instruction_type:\s*\w*REMOTE')


def collectives_in_profile(profile_dir: Path | str, not_modelled: list[Unmodelled] | None = None
                           ) -> list[Collective]:
    """The collectives among the profile files, read as ``read_cycles`` reads them (same glob, first estimate).

    An op that moves data to other chips (a remote DMA) but is no collective this model knows (e.g. a Pallas
    kernel doing remote copies, an unknown opcode) is appended to ``not_modelled`` when it is given.
    """
    found: list[Collective] = []
    root = Path(profile_dir)
    files = sorted(root.glob("*static_llo_profile*.textproto")) if root.is_dir() else []
    for path in files:
        text = path.read_text(errors="replace")
        if not _INTERESTING_RE.search(text):
            continue
        est = parse_textproto(text).get("hlo_op_estimate", [{}])[0]
        name = est.get("hlo_op_name", [path.name])[0]
        instr = est.get("hlo_instruction", [{}])[0]
        opcode = instr.get("opcode", ["?"])[0]
        kind = opcode.removesuffix("-start").removesuffix("-done")
        dma = est.get("dma_instruction_type", ["?"])[0]
        if kind not in COLLECTIVE_KINDS and "REMOTE" not in dma:
            continue                # e.g. a fusion whose called computation merely names a collective
        try:
            if kind not in COLLECTIVE_KINDS:
                raise NotModelled(f"op {opcode!r} moves data to other chips "
                                  f"({dma}); not a modelled collective")
            if opcode.endswith("-done"):
                continue            # the -start (or the sync op) carries the transfer
            if "shape" not in instr:
                raise NotModelled("its profile carries no shape")
            result = _proto_shape_arrays(instr["shape"][0])
            operands = [b for s in est.get("operand_shapes", []) for b in _proto_shape_arrays(s)]
            nbytes = _collective_bytes(kind, opcode, result, operands)
        except NotModelled as e:
            if not_modelled is not None:
                not_modelled.append(Unmodelled(name, kind, str(e)))
            continue
        pairs = tuple((int(p["source"][0]), int(p["target"][0])) for p in instr.get("source_target_pairs", []))
        groups = _proto_groups(instr.get("collective_device_list", [{}])[0])
        groups += tuple(tuple(int(i) for i in g.get("replica_ids", [])) for g in instr.get("replica_groups", []))
        found.append(Collective(kind, name, nbytes, groups, pairs,
                                instr.get("metadata", [{}])[0].get("op_name", [""])[0],
                                int(est.get("estimated_cycles", ["0"])[0])))
    return found


def _collective_bytes(kind: str, opcode: str, result: list[int], operands: list[int]) -> int:
    if opcode.endswith("-start"):       # (operand, output[, contexts]): the largest array is the transfer
        return max(result + operands)
    if kind == "reduce-scatter":        # the per-chip input is what the ring reduces
        return max(sum(operands), sum(result))
    if kind == "all-reduce":            # seen: f32 operand, bf16 result; count the wider
        return max(sum(operands), sum(result))
    return sum(result)


# ---------------------------------------------------------------- the compiled HLO text (for what has no file)
_HLO_LINE_RE = re.compile(rf"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+({_OPCODE_RE})\((.*)$", re.M)
_HLO_ARRAY_RE = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\](?:\{([^}]*)\})?")


def collectives_in_hlo(hlo_text: str) -> list[Collective]:
    """Collectives in ``compiled.as_text()``: the async ones (collective-permute-start) write no profile file."""
    out = []
    for name, shape, opcode, rest in _HLO_LINE_RE.findall(hlo_text):
        if opcode.endswith("-done"):
            continue
        arrays = []
        for dtype, dims, layout in _HLO_ARRAY_RE.findall(shape):
            m2m, _, tiles = layout.partition(":")
            tile = re.match(r"T\(([\d,]+)\)", tiles)
            arrays.append(array_bytes(dtype, [int(d) for d in dims.split(",") if d],
                                      [int(d) for d in m2m.split(",") if d] or None,
                                      [int(t) for t in tile.group(1).split(",")] if tile else None))
        kind = opcode.removesuffix("-start")
        nbytes = max(arrays) if opcode.endswith("-start") else sum(arrays)
        groups: tuple[tuple[int, ...], ...] = ()
        if m := re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", rest):
            groups = tuple(tuple(int(i) for i in g.split(",") if i) for g in re.findall(r"\{([\d,]*)\}", m.group(1)))
        elif m := re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", rest):
            groups = _iota_groups(int(m.group(1)), int(m.group(2)), [int(d) for d in m.group(3).split(",")],
                                  [int(p) for p in m.group(4).split(",")] if m.group(4) else [])
        pairs = tuple((int(a), int(b)) for a, b in re.findall(r"\{(\d+),(\d+)\}",
                      (re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", rest) or [None, ""])[1]))
        jax_op = (re.search(r'op_name="([^"]*)"', rest) or [None, ""])[1]
        out.append(Collective(kind, name, nbytes, groups, pairs, jax_op, 0, "hlo"))
    return out
