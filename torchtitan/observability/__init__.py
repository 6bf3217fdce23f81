"""Observability: Flight Recorder dumps and hang reports, profiling, non-finite checks, faults.

Submodules, each importable on its own (none is imported here, to keep ``import torchtitan``
cheap): ``flight_recorder``, ``hang_report`` (also ``python -m
torchtitan.observability.hang_report DIR``), ``profiling``, ``numerics``, ``fault_injection``
(test-only, inert unless ``TORCHTITAN_FAULT`` is set). See docs/observability.md.
"""
