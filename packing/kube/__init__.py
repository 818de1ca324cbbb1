"""The Kubernetes substrate under both services: one client, one informer, one event writer.

``extender`` and ``enforcement`` never import each other, and the top level is fixed, so what both
need to reach the API server lives here, a subpackage of ``packing`` that is *not* pure: it does
network I/O through the ``kubernetes`` client. The rule that keeps ``packing`` pure is one-way and
checked (``tests/unit/test_layering.py``): no module of ``packing`` outside ``packing.kube``, and
nothing in ``simulations``, imports ``packing.kube`` or any I/O library; ``packing.kube`` imports
nothing of ``extender``, ``enforcement`` or ``simulations``.

* ``client``: ``Kube``, raw-JSON requests signed with the ``kubernetes`` client's credentials, and
  ``KubeError``, the one error type;
* ``informer``: ``Informer``, a resumable list+watch cache with tombstones and drift reporting;
* ``events``: ``EventWriter``, core/v1 Events about a pod, written now or queued to a thread;
* ``objects``: reading fields of API objects (pure).
"""
