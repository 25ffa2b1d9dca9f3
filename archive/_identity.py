"""The identity of an individual: a hash of its source with formatting noise removed."""

from __future__ import annotations

import hashlib

import libcst as cst

ID_LENGTH = 16


class _StripComments(cst.CSTTransformer):
    """Drop comment lines and blank lines; drop trailing comments and the spaces before them."""

    def leave_EmptyLine(self, original_node, updated_node):
        return cst.RemoveFromParent()

    def leave_TrailingWhitespace(self, original_node, updated_node):
        return updated_node.with_changes(whitespace=cst.SimpleWhitespace(""), comment=None)


def normalize_source(source: str) -> str:
    """The source as libcst round-trips it, without comments, blank lines or trailing spaces.

    Source that does not parse (a screen failure is still archived) is normalised line by
    line instead: trailing spaces and blank lines removed.
    """
    text = source.replace("\r\n", "\n").replace("\r", "\n")
    try:
        module = cst.parse_module(text)
        text = module.visit(_StripComments()).code
    except (cst.ParserSyntaxError, RecursionError, ValueError):
        pass
    lines = (line.rstrip() for line in text.split("\n"))
    return "\n".join(line for line in lines if line and not line.lstrip().startswith("#")) + "\n"


def individual_id(source: str) -> str:
    """16 hex characters of the sha256 of :func:`normalize_source` (``source``).

    Two sources that differ only in comments, blank lines or trailing spaces share an id.
    """
    digest = hashlib.sha256(normalize_source(source).encode("utf-8")).hexdigest()
    return digest[:ID_LENGTH]
