"""The generated stubs, checked to be present and current (see the package docstring)."""

from __future__ import annotations

from enforcement.kubeletapi.generate import up_to_date

if not up_to_date():
    raise ImportError(
        "the kubelet API stubs are missing or stale: run `make` (or "
        "`python -m enforcement.kubeletapi.generate` with grpcio-tools installed)"
    )

from enforcement.kubeletapi.protos import (
    deviceplugin_pb2,
    deviceplugin_pb2_grpc,
    dra_pb2,
    dra_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
    podresources_pb2,
    podresources_pb2_grpc,
)

__all__ = [
    "deviceplugin_pb2",
    "deviceplugin_pb2_grpc",
    "dra_pb2",
    "dra_pb2_grpc",
    "pluginregistration_pb2",
    "pluginregistration_pb2_grpc",
    "podresources_pb2",
    "podresources_pb2_grpc",
]
