"""The one exception the archive raises for a bad data directory or a bad file in it."""

from __future__ import annotations


class ArchiveError(Exception):
    """The data directory or a file in it cannot be read or written.

    The message is one line saying what is wrong and how to fix it; the CLI prints it and
    exits with status 2. Nothing stored is modified when it is raised.
    """
