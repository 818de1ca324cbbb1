"""Cluster integration: informers, the API binder, scheduling gates, leader election, DRA claims.

Everything here talks to the API server through the ``kubernetes`` client and feeds the same
``ExtenderState`` the HTTP layer uses; the API server stays the only durable state.
"""
