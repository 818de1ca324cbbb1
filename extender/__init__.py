"""The kube-scheduler HTTP extender: filter, prioritize and bind GPU slices with the packing core.

``wire`` (the JSON kube-scheduler speaks), ``podspec`` (pod -> Request), ``inventory`` (node ->
GPUs), ``state`` (ledger + queue + pod cache behind one lock), ``app`` (Flask, served by gunicorn
with ``gunicorn_conf``), ``standalone`` (no cluster), ``cli`` (``gpuslice serve`` / ``status``).
"""
