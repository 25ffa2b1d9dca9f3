"""The one kind of error a person at the keyboard sees: one line, what is wrong and how to fix it."""


class UsageError(Exception):
    """Bad input from the command line or a configuration file (exit status 2)."""
