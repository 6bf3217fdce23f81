"""``--optimizer.overlap_forward`` on CUDA: the update on its own stream, each block's forward
waiting for its block's update (FSDP's all-gather streams and the compute stream), gives the
curve of the plain update.

A missed wait (a block's forward reading weights before or while the update writes them) or
gradients freed too early would change the curve. The two plain runs show how far two identical
runs differ here (0 where every kernel is deterministic); the overlapped run must stay within
that.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.distributed.launch import TINY_JOB, curves, torchrun

FLOAT8 = [
    "--float8.enable",
    "--float8.fsdp_float8_all_gather",
    "--float8.precompute_scales",
    "--float8.skip_small=false",
]


def _curve(folder, nproc: int, *extra: str) -> list[float]:
    torchrun(nproc, [*TINY_JOB, "--training.steps=8", f"--job.dump_folder={folder}", *extra])
    loss, grad_norm = curves(folder)
    return loss + grad_norm


@pytest.mark.parametrize(
    "nproc, extra",
    [(1, ["--compile.enable"]), (2, ["--compile.enable"]), (2, FLOAT8)],
    ids=["one_gpu_compiled", "fsdp2_compiled", "fsdp2_float8_precomputed_scales"],
)
def test_overlapped_update_gives_the_plain_curve(tmp_path, nproc, extra):
    if not torch.cuda.is_available() or torch.cuda.device_count() < nproc:
        pytest.skip(f"needs {nproc} CUDA devices")
    if extra is FLOAT8 and (
        importlib.util.find_spec("torchao") is None or torch.cuda.get_device_capability() < (8, 9)
    ):
        pytest.skip("needs torchao and float8 tensor cores")
    plain = [_curve(tmp_path / f"plain{i}", nproc, *extra) for i in range(2)]
    overlapped = _curve(tmp_path / "overlapped", nproc, *extra, "--optimizer.overlap_forward")
    noise = max(abs(a - b) for a, b in zip(*plain))
    worst = max(abs(a - b) for a, b in zip(plain[0], overlapped))
    print(f"plain runs differ by {noise:.3g}; overlapped differs from plain by {worst:.3g}")
    assert worst <= 2 * noise, (plain[0], overlapped)
