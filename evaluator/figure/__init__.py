"""The figure: how fast a kernel is, and by which timing source.

``timing`` turns what the runner produced into a latency: measured on a TPU host, or libtpu's
static cycle estimate off one, never below the HBM traffic the kernel moves (``hbm_traffic``: its
grid, windows and index maps as the chip evaluates them), with loops and branches on data counted
on every input set (``trips``, through static ``variants``), the kernel's own copies counted as
they ran (``dmas``), collectives found and costed (``collectives``, ``ici_model``), and the
roofline a figure is held against (``roofline``). If "the figure is wrong", look here. Trusts:
the compiler's estimate for what it can see, and the runner's counts for what it cannot.
"""
