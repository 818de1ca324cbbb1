"""Shared pytest configuration: hypothesis profiles.

``ci`` (the default) never fails on timing, since the test machines are shared and noisy; pick
another with ``HYPOTHESIS_PROFILE=dev`` (fewer examples, for a quick local loop).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", deadline=None, derandomize=False, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", parent=settings.get_profile("ci"), max_examples=20)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
