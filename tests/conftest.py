"""Settings every test shares. Module level on purpose: it runs before any test module is
imported, and subprocesses the tests start (torchrun, the trainer) inherit os.environ."""

import os

import pytest

from tests.reaper import pytest_configure  # noqa: F401  (a killed run leaves no process behind)

# Tests never reach the network: the bundled sample, local files and fake hub repos only.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# One inductor compile worker (before torch._inductor.config reads it): on the 2-core CI machine
# the multi-rank tests already keep both cores busy, and a worker pool per rank (a fresh
# interpreter importing torch) costs more than it saves: a 4-rank compile parity test took 72.5 s
# instead of 78 s with one.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# One OpenMP thread per process: pytest-xdist runs two test processes on CI's two cores, and
# each would otherwise start an OpenMP pool as wide as the machine for every op, as would the
# trainers the tests start. Oversubscribed, a set of unit tests that start trainers ran 2.8x
# slower on the 2-core machine. (Read when torch loads OpenMP; torch is not imported yet.)
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _restore_inductor_config():
    """The trainer sets process-wide inductor options (collective reordering, eager rounding
    for rowwise float8); give every test the configuration the one before it started with."""
    import torch._inductor.config as inductor_config

    saved = inductor_config.get_config_copy()
    yield
    inductor_config.load_config(saved)
