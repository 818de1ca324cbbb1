"""The kube-scheduler HTTP extender: filter, prioritize and bind GPU slices with the packing core.

``wire`` (the JSON kube-scheduler speaks), ``asks`` (pod -> what it asks for), ``inventory`` and
``inventory_sync`` (node -> GPUs -> ledger), ``cache`` (the admitted claims behind one lock),
``decide`` (pure filter / score / bind decisions), ``waiting_room`` (the queue), ``state`` (the verbs
over those parts), ``app`` (Flask), ``front`` and ``worker`` (gunicorn's asyncio worker in front of
it, ``gunicorn_conf``), ``standalone`` (no cluster), ``cli`` (``gpuslice serve`` / ``status``).
"""
