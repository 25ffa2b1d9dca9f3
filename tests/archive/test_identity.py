"""An individual's id is stable across versions: archives made before keep their rows' ids. The
ids were first made with a libcst round trip (below, as the definition); the tokenizer's faster cut
must give the very same text, on our seeds, on JAX's own kernels (read from the installed package)
and on the corners of Python's syntax where a ``#`` is not a comment."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from archive import individual_id
from archive._identity import normalize_source

ROOT = Path(__file__).resolve().parents[2]


class _StripComments(cst.CSTTransformer):
    def leave_EmptyLine(self, original_node, updated_node):
        return cst.RemoveFromParent()

    def leave_TrailingWhitespace(self, original_node, updated_node):
        return updated_node.with_changes(whitespace=cst.SimpleWhitespace(""), comment=None)


def by_libcst(source: str) -> str:
    """The normalisation as ids were first made (archive/_identity.py before it used the tokenizer)."""
    text = source.replace("\r\n", "\n").replace("\r", "\n")
    try:
        text = cst.parse_module(text).visit(_StripComments()).code
    except (cst.ParserSyntaxError, RecursionError, ValueError):
        pass
    lines = (line.rstrip() for line in text.split("\n"))
    return "\n".join(line for line in lines if line and not line.lstrip().startswith("#")) + "\n"


CORNERS = {
    "hash in strings": 's = "a # b"  # c\nt = \'#\'\nu = f"{x} # {y}"  # d\n',
    "comments in brackets": "x = f(a,  # one\n      # two\n      b)  # three\n",
    "hash lines in a multi-line string": 'doc = """\n  # not a comment\n\n  text   \n"""\n',
    "continued line": "x = 1 + \\\n    2  # sum\n",
    "decorators and blank lines": "@dec  # d\n\n# c\ndef f():\n\n    # inner\n    return 1    \n\n\n",
    "no final newline": "x = 1  # c",
    "CRLF and CR": "x = 1  # c\r\ny = 2\r# z\rz = 3\r\n",
    "tabs and form feed": "if x:\n\ty = 1\t# t\n\x0c\nz = 2\n",
    "comment only": "# just this\n",
    "does not parse": "def f(:\n  x = 1  # kept: no parse, lines only\n",
}


@pytest.mark.parametrize("name", sorted(CORNERS))
def test_the_corners_normalise_as_libcst_did(name):
    assert normalize_source(CORNERS[name]) == by_libcst(CORNERS[name])


def _sources() -> list[Path]:
    import jax.experimental.pallas.ops.tpu as jax_kernels

    ours = sorted((ROOT / "seeds").rglob("*.py")) + sorted((ROOT / "examples").rglob("*.py"))
    return ours + sorted(Path(jax_kernels.__file__).parent.rglob("*.py"))


def test_seeds_examples_and_jax_kernels_normalise_as_libcst_did():
    files = _sources()
    assert len(files) > 30
    differ = [str(f) for f in files if normalize_source(f.read_text()) != by_libcst(f.read_text())]
    assert not differ



def test_a_hash_in_a_string_is_kept():
    assert individual_id('s = "# not a comment"\n') != individual_id('s = ""\n')


def test_what_does_not_compile_is_normalised_by_lines():
    # libcst parsed this one; it cannot run, and it is the documented exception
    assert normalize_source("return 1  # c\n\n") == "return 1  # c\n"
