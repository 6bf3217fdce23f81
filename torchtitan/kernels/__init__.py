"""Kernels on the default path: the in-place cross-entropy loss (Triton on CUDA, torch ops
elsewhere) and the vocabulary-shard bookkeeping it shares with loss parallel."""
