"""The generated stubs, checked to be present and current (see the package docstring).

The ``*_pb2`` message modules are typed (protoc writes ``.pyi`` files); the ``*_pb2_grpc``
service modules are not, so they are exported as ``Any``.
"""

from __future__ import annotations

from typing import Any

from enforcement.kubeletapi.generate import up_to_date

if not up_to_date():
    raise ImportError(
        "the kubelet API stubs are missing or stale: run `make` (or "
        "`python -m enforcement.kubeletapi.generate` with grpcio-tools installed)"
    )

from enforcement.kubeletapi.protos import (
    deviceplugin_pb2,
    dra_pb2,
    nri_pb2,
    pluginregistration_pb2,
    podresources_pb2,
    ttrpc_pb2,
)
from enforcement.kubeletapi.protos import deviceplugin_pb2_grpc as _deviceplugin_grpc
from enforcement.kubeletapi.protos import dra_pb2_grpc as _dra_grpc
from enforcement.kubeletapi.protos import pluginregistration_pb2_grpc as _registration_grpc
from enforcement.kubeletapi.protos import podresources_pb2_grpc as _podresources_grpc

deviceplugin_pb2_grpc: Any = _deviceplugin_grpc
dra_pb2_grpc: Any = _dra_grpc
pluginregistration_pb2_grpc: Any = _registration_grpc
podresources_pb2_grpc: Any = _podresources_grpc

__all__ = [
    "deviceplugin_pb2",
    "deviceplugin_pb2_grpc",
    "dra_pb2",
    "dra_pb2_grpc",
    "nri_pb2",
    "pluginregistration_pb2",
    "pluginregistration_pb2_grpc",
    "podresources_pb2",
    "podresources_pb2_grpc",
    "ttrpc_pb2",
]
