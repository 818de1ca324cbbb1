"""gpuslice's pure core: product catalog, cluster ledger, placement policies and the queue.

No I/O beyond reading the catalog file, no Kubernetes, no HTTP: the extender, the node agent and
the simulator all drive this package through the same small interfaces.
"""
