"""Inference in one process (CPU or one GPU), behind ``python -m torchtitan.generate``:

* ``weights``: find and check a DCP checkpoint or Hugging Face folder, build the model, load it;
* ``sampling``: the KV-cache decode loop, greedy or top-k sampling from a seeded generator;
* ``batch_output``: several sequences' header lines, ``--output`` file and summary.
"""
