"""gpuslice's simulator for capacity planners: trace readers, a discrete-event engine over the
very ``packing`` ledger, policies and queue the extender uses, reports and a sizing search.

Every policy, baselines included, comes from ``packing.policies``' one registry: the simulator
runs exactly the set ``gpuslice serve --policy`` offers.
"""
