"""Settings every test shares. Module level on purpose: it runs before any test module is
imported, and subprocesses the tests start (torchrun, the trainer) inherit os.environ."""

import os

import pytest

# Tests never reach the network: the bundled sample, local files and fake hub repos only.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _restore_inductor_config():
    """The trainer sets process-wide inductor options (collective reordering, eager rounding
    for rowwise float8); give every test the configuration the one before it started with."""
    import torch._inductor.config as inductor_config

    saved = inductor_config.get_config_copy()
    yield
    inductor_config.load_config(saved)
