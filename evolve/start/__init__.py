"""Where a run starts: the kernel it begins from (a seed's, an installed module's, a file) and the
graft that puts a kernel into a larger reference workload."""
