"""What a seed's kernel takes: its reference file's ``SIGNATURE``, and the orders in which a
user's workload's inputs fit it.

    SIGNATURE = "q: bf16[B,H,S,D], k: bf16[B,H,S,D], v: bf16[B,H,S,D] -> bf16[B,H,S,D]"
    UNITS = "B"            # the workload is independent along these (evaluator: model-sized checks)

One entry per parameter of the seed's workload, in its order: a name, a dtype (bf16, f16, f32,
f64, i8, i32, i64, bool) and the dimensions, each an upper-case symbol that binds one size
wherever it appears, or an integer the kernel needs exactly; after ``->``, the output's. ``UNITS``
names symbols along which the workload is independent: the output's slice at a position of
them is the workload of the inputs' slices at that position (a batch row, a head whose
computation does not depend on its index, a token). Each input carries all of them or none.

A reference file with no kernel of its own is served by every seed whose signature its inputs
fit (evolve/start/serve.py): the fits are the orders of its inputs that give each of the seed's
parameters an input of its dtype and rank with every symbol bound to one size. The file is read
without being run.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8",
          "i32": "int32", "i64": "int64", "bool": "bool"}
_ENTRY = re.compile(r"^\s*([A-Za-z_]\w*)\s*:\s*(\w+)\s*\[([^\]]*)\]\s*$")
MAX_FITS = 24          # orders enumerated per seed (ranked; the judge tries the first few)


class SignatureError(ValueError):
    """A SIGNATURE that cannot be read: one line saying what is wrong."""


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    dtype: str                       # numpy's name: "bfloat16", "float32", ...
    dims: tuple[str | int, ...]

    def __str__(self) -> str:
        short = next(k for k, v in DTYPES.items() if v == self.dtype)
        return f"{self.name}: {short}[{','.join(map(str, self.dims))}]"


def parse(text: str) -> tuple[Param, ...]:
    """The parameters ``text`` declares (its output aside); SignatureError saying which entry is wrong."""
    params = []
    for item in re.split(r",\s*(?=[A-Za-z_]\w*\s*:)", text.partition("->")[0].strip()):
        match = _ENTRY.match(item)
        if not match:
            raise SignatureError(f"SIGNATURE entry {item.strip()!r} is not 'name: dtype[D1,D2,...]'")
        name, dtype, dims = match.groups()
        if dtype not in DTYPES:
            raise SignatureError(f"SIGNATURE entry {name}: unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
        parsed: list[str | int] = []
        for dim in filter(None, (d.strip() for d in dims.split(","))):
            if dim.isdigit():
                parsed.append(int(dim))
            elif re.fullmatch(r"[A-Z_][A-Z0-9_]*", dim):
                parsed.append(dim)
            else:
                raise SignatureError(f"SIGNATURE entry {name}: dimension {dim!r} is neither an integer nor an "
                                     "upper-case symbol")
        params.append(Param(name, DTYPES[dtype], tuple(parsed)))
    if not params:
        raise SignatureError("SIGNATURE is empty")
    return tuple(params)


def output(text: str) -> Param | None:
    """The output a signature declares after ``->`` (None: none)."""
    _, arrow, out = text.partition("->")
    return parse(f"out: {out.strip()}")[0] if arrow else None


@dataclasses.dataclass(frozen=True)
class Units:
    """``UNITS``: the symbols the workload is independent along, and where each array holds them."""

    symbols: tuple[str, ...]
    params: tuple[Param, ...]
    output: Param

    def axes(self, param: Param) -> tuple[int, ...]:
        """The axes of ``param`` holding the units, in the units' order (() : it holds none)."""
        held = tuple(param.dims.index(s) for s in self.symbols if s in param.dims)
        return held if len(held) == len(self.symbols) else ()


def _constant(reference: str | Path, name: str) -> str | None:
    tree = ast.parse(Path(reference).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                raise SignatureError(f"{reference}: {name} must be a string literal")
            return node.value.value
    return None


def declared(reference: str | Path) -> tuple[Param, ...] | None:
    """The SIGNATURE of the reference file at ``reference`` (None: it declares none)."""
    text = _constant(reference, "SIGNATURE")
    return parse(text) if text is not None else None


def declared_units(reference: str | Path) -> Units | None:
    """The reference file's UNITS with its SIGNATURE (None: it declares none); SignatureError
    where they disagree."""
    units, text = _constant(reference, "UNITS"), _constant(reference, "SIGNATURE")
    if not units:
        return None
    if text is None or output(text) is None:
        raise SignatureError(f"{reference}: UNITS needs a SIGNATURE with its output ('... -> dtype[dims]')")
    params, out = parse(text), output(text)
    symbols = tuple(u.strip() for u in units.split(",") if u.strip())
    found = Units(symbols, params, out)
    for param in (*params, out):
        held = [s for s in symbols if s in param.dims]
        if held and not found.axes(param):
            raise SignatureError(f"{reference}: {param.name} holds {', '.join(held)} but not every unit "
                                 f"({units}); an array holds all of UNITS or none")
    if not found.axes(out):
        raise SignatureError(f"{reference}: the output must hold every unit ({units})")
    return found


def _bind(param: Param, shape: tuple[int, ...], dtype: str, bound: dict[str, int]) -> dict[str, int] | None:
    if dtype != param.dtype or len(shape) != len(param.dims):
        return None
    out = dict(bound)
    for dim, size in zip(param.dims, shape):
        if isinstance(dim, int):
            if dim != size:
                return None
        elif out.setdefault(dim, size) != size:
            return None
    return out


def fits(params: tuple[Param, ...], specs: list[tuple[tuple[int, ...], str]],
         names: tuple[str, ...] = ()) -> list[tuple[int, ...]]:
    """The orders of the inputs ``specs`` ((shape, dtype) each, the user's order) that fit
    ``params``: order[k] is the input the seed's k-th parameter takes. Best first: the most
    parameters whose names match the inputs' (``names``, case and underscores aside), then the
    most inputs in their own place. At most MAX_FITS."""
    if len(params) != len(specs):
        return []
    found: list[tuple[int, ...]] = []

    def walk(k: int, order: tuple[int, ...], bound: dict[str, int]) -> None:
        if len(found) >= MAX_FITS * 8:
            return
        if k == len(params):
            found.append(order)
            return
        for i, (shape, dtype) in enumerate(specs):
            if i not in order:
                more = _bind(params[k], tuple(shape), dtype, bound)
                if more is not None:
                    walk(k + 1, order + (i,), more)

    walk(0, (), {})

    def norm(name: str) -> str:
        return name.lower().replace("_", "")

    def rank(order: tuple[int, ...]) -> tuple[int, int]:
        named = sum(1 for k, i in enumerate(order) if i < len(names) and norm(names[i]) == norm(params[k].name))
        return (-named, -sum(1 for k, i in enumerate(order) if k == i))

    return sorted(found, key=rank)[:MAX_FITS]


def why_not(params: tuple[Param, ...], specs: list[tuple[tuple[int, ...], str]]) -> str:
    """One phrase: why no order of ``specs`` fits ``params``."""
    if len(params) != len(specs):
        return f"takes {len(params)} inputs, the workload has {len(specs)}"
    wanted = sorted((p.dtype, len(p.dims)) for p in params)
    given = sorted((dtype, len(shape)) for shape, dtype in specs)
    if wanted != given:
        return "its inputs' dtypes and ranks differ from the workload's"
    return "no order of the workload's inputs binds its dimensions consistently"


def describe(params: tuple[Param, ...]) -> str:
    return ", ".join(map(str, params))

