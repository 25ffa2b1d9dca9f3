"""Where candidates are judged: one plugin family behind ``base.Executor`` (its registry,
``EXECUTORS``, and ``open_executor``): here, a pool of local judges (``base.LocalExecutor``), or a
Ray cluster, local or remote, with one archive (``ray_executor``)."""
