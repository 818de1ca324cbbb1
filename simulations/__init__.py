"""gpuslice's simulator for capacity planners: trace readers, a discrete-event engine over the
very ``packing`` ledger, policies and queue the extender uses, reports and a sizing search.

``simulations.registry`` registers the simulator-side policies (the FGD study's baselines and
``frag-gradient``) with ``packing.policies``; every entry point imports it.
"""
