"""The one exception an operator's rewrite raises: it lives below every module that raises it
(``_base``, ``_sites``, ``_cst``), so none of them imports another for it."""


class NotApplicable(Exception):
    """Raised inside an operator's rewrite to say "does not apply"; never escapes the base."""
