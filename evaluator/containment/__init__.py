"""Containment: what keeps a candidate in its box.

A candidate's code runs only in the jailed worker (``worker``): namespaces, the ``nobody`` user
and no network (``jail``), process limits, budgets and the child's report (``sandbox``), started
and read by ``children``. ``screen`` is the fast first filter over a candidate's source, with
messages; it is not the boundary. If a candidate escaped (wrote outside its scratch directory,
read the parent's environment, outlived its evaluation), look here. Trusts: nothing the worker
says but its exit and its one exported program, which the runner reads as data.
"""
