"""Settings every test shares. Module level on purpose: it runs before any test module is
imported, and subprocesses the tests start (torchrun, the trainer) inherit os.environ."""

import os

# Tests never reach the network: the bundled sample, local files and fake hub repos only.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
