"""The kubelet's gRPC APIs (and the runtime's NRI) that the node agent speaks, as stubs generated from ``protos/``.

* ``pluginregistration``: plugin registration v1; we serve ``plugins_registry/gpuslice.io-reg.sock``;
* ``dra``: DRA ``v1.DRAPlugin``; we serve ``plugins/gpuslice.io/dra.sock``;
* ``deviceplugin``: device plugin v1beta1; the kubelet serves ``device-plugins/kubelet.sock``
  (Registration), we serve one ``device-plugins/gpuslice.io-<product>.sock`` per product;
* ``podresources``: PodResources v1; the kubelet serves ``pod-resources/kubelet.sock``;
* ``nri``, ``ttrpc``: containerd's NRI v1alpha1 (the subset our plugin uses) and its ttrpc
  envelope; the runtime serves ``/var/run/nri/nri.sock``.

The stubs are generated at build time (``make``, or ``python -m enforcement.kubeletapi.generate``)
from the ``.proto`` files; importing ``enforcement.kubeletapi.stubs`` without them says so plainly.
"""
