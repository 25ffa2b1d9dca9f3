"""The identity of an individual: a hash of its source with formatting noise removed."""

from __future__ import annotations

import hashlib
import io
import tokenize
import warnings

ID_LENGTH = 16
_FILENAME = "<individual source>"
# Whether a source parses is asked of compile(), not ast.parse: in CPython 3.11 before 3.11.9
# (gh-106905) building ast objects in two threads at once can fail ("AST constructor recursion
# depth mismatch"), and a run makes ids in its judging threads while breeding calls
# ast.literal_eval. What the compile warns of (an ``is`` with a literal) is the judge's to tell.
warnings.filterwarnings("ignore", module=_FILENAME)


def normalize_source(source: str) -> str:
    """The source without comments, blank lines or trailing spaces.

    Each comment is cut from its line (Python's own tokenizer says where comments are; a ``#`` in
    a string is not one), then every line is right-stripped, and blank lines and lines starting
    with ``#`` (as in a multi-line string) dropped. The same text as the libcst round trip that ids
    were first made with (parse, drop ``EmptyLine`` nodes and trailing comments, print), a tenth of
    the time: breeding from JAX's flash attention module spent a fifth of its time here.

    Source that does not compile (a screen failure is still archived) is normalised line by
    line instead: trailing spaces and blank lines removed. libcst parsed a few sources that do not
    compile (a ``return``, ``await`` or ``nonlocal`` outside a function): theirs are the only ids
    that differ from before, of kernels that cannot run.
    """
    text = source.replace("\r\n", "\n").replace("\r", "\n")
    try:
        compile(text, _FILENAME, "exec", dont_inherit=True)
        lines = text.split("\n")
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                row, col = token.start
                lines[row - 1] = lines[row - 1][:col]
        text = "\n".join(lines)
    except (SyntaxError, tokenize.TokenError, ValueError, RecursionError, MemoryError, OverflowError):
        pass
    stripped = (line.rstrip() for line in text.split("\n"))
    return "\n".join(line for line in stripped if line and not line.lstrip().startswith("#")) + "\n"


def individual_id(source: str) -> str:
    """16 hex characters of the sha256 of :func:`normalize_source` (``source``).

    Two sources that differ only in comments, blank lines or trailing spaces share an id.
    """
    digest = hashlib.sha256(normalize_source(source).encode("utf-8")).hexdigest()
    return digest[:ID_LENGTH]
