"""gpuslice's node agent: memory caps and compute-share pacing for the slices on one node.

It reads which pod holds which slice from the allocation record on the pod (``packing.record``),
maps GPU processes to pods through their cgroups, kills a container's largest process when its
slice is over its memory cap, and duty-cycles container cgroups so that contended GPUs are shared
by entitlement. Everything that touches the host (NVML, /proc, cgroupfs, signals, the API server)
sits behind a small interface with a simulated twin, so the whole agent runs without a GPU.
"""
