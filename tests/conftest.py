"""Test setup: hypothesis profiles and the import path for tests/helpers.py.

Profiles (pick with HYPOTHESIS_PROFILE=ci):
  default  few examples, random each run: quick local feedback
  ci       more examples, derandomized so a CI failure reproduces exactly
"""
import os
import sys

from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile("default", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=50, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
