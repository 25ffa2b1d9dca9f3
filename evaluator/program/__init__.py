"""The program: what a candidate hands over, and what the judge lets it be.

The worker traces the candidate once and ships its jaxpr as plain data (``wire``); the trusted
runner rebuilds it and lowers it both ways from that one jaxpr (``traced``, with the jaxpr walks
of ``jaxpr_tools``), then audits what the compiler will see (``kernel_audit``: host callbacks,
loops and branches on data, unparsed kernels), its constants against a budget (``constants``)
and its compiler parameters against an allow-list (``compiler_params``). If "the program timed
is not the program checked", look here. Trusts: only what it rebuilt and lowered itself.
"""
