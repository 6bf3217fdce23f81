"""Throughput, MFU and memory metrics: one console line per log step, the same in TensorBoard."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger("torchtitan")

# Dense bf16 peak of one device, by a substring of torch.cuda.get_device_name().
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def peak_flops(device: torch.device) -> float | None:
    """Dense bf16 peak of the device, or None where unknown (then MFU is omitted)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_FLOPS.items() if key in name), None)


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


@dataclass
class StepStats:
    """What the trainer measured for one optimizer step."""

    step: int
    loss: float | torch.Tensor
    grad_norm: float | torch.Tensor
    lr: float
    tokens: int  # tokens this device processed in the step
    data_seconds: float  # time spent waiting for batches
    data_windows: int = 0  # samples the global data stream has handed out so far (all ranks)
    # More of the step's values, logged as they are (MoE load balance: moe_balance.py).
    extra: dict[str, float | torch.Tensor] = field(default_factory=dict)


@dataclass
class MetricsLogger:
    """Accumulates step stats between log steps; the logging rank prints them and writes them to
    ``dump_folder/metrics/<run_id>.jsonl`` and TensorBoard (``dump_folder/tb/<run_id>``)."""

    device: torch.device
    flops_per_token: int
    total_steps: int
    log_freq: int
    dump_folder: Path | None = None
    run_id: str = "run"
    enable_tensorboard: bool = True
    enabled: bool = True  # only the logging rank prints and writes
    # float8 GEMMs peak at twice bf16's: MFU stays against the bf16 peak and says so in its name.
    float8: bool = False
    _tokens: int = 0
    _data_seconds: float = 0.0
    _window_start: float = field(default_factory=time.perf_counter)
    _steps_in_window: int = 0
    _writer: object = None
    _jsonl: object = None

    def __post_init__(self):
        self.peak = peak_flops(self.device)
        if self.enabled and self.dump_folder is not None:
            (self.dump_folder / "metrics").mkdir(parents=True, exist_ok=True)
            self._jsonl = open(self.dump_folder / "metrics" / f"{self.run_id}.jsonl", "a")
            if self.enable_tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(log_dir=str(self.dump_folder / "tb" / self.run_id))
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    @property
    def _mfu_key(self) -> str:
        return "mfu_bf16_peak_pct" if self.float8 else "mfu_pct"

    def should_log(self, step: int) -> bool:
        return step == 1 or step % self.log_freq == 0 or step == self.total_steps

    def record(self, stats: StepStats) -> dict[str, float] | None:
        """Add one step; on a log step, return (and print/write) the metrics of the window."""
        self._tokens += stats.tokens
        self._data_seconds += stats.data_seconds
        self._steps_in_window += 1
        if not self.should_log(stats.step):
            return None
        metrics = self._window_metrics(stats)
        if self.enabled:
            logger.info(self._console_line(stats.step, metrics))
            self._write(stats.step, metrics)
        self._tokens, self._data_seconds, self._steps_in_window = 0, 0.0, 0
        self._window_start = time.perf_counter()
        return metrics

    def record_validation(self, step: int, metrics: dict[str, float]) -> None:
        """Print and write one validation's metrics (``val_*`` keys, ``val_seconds`` among them).
        Its time is taken out of the throughput window: tokens/s measure training alone."""
        self._window_start += metrics["val_seconds"]
        if self.enabled:
            logger.info(self._validation_line(step, metrics))
            self._write(step, metrics)

    def _write(self, step: int, metrics: dict[str, float]) -> None:
        """One JSONL row (``step`` + metrics) and one TensorBoard scalar per metric."""
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
            self._jsonl.flush()
        if self._writer is not None:
            for name, value in metrics.items():
                self._writer.add_scalar(name, value, step)

    def _window_metrics(self, stats: StepStats) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self._window_start, 1e-9)
        tps = self._tokens / elapsed
        tflops = self.flops_per_token * tps / 1e12
        m = {
            # Device tensors during training: read here, on log steps only (a host sync).
            "loss": float(stats.loss),
            "grad_norm": float(stats.grad_norm),
            "lr": stats.lr,
            "tokens_per_second": tps,
            "tflops": tflops,
            "data_loading_pct": 100.0 * self._data_seconds / elapsed,
            "step_seconds": elapsed / self._steps_in_window,
            "data_windows": stats.data_windows,
            **{name: float(value) for name, value in stats.extra.items()},
        }
        if self.peak:
            m[self._mfu_key] = 100.0 * tflops * 1e12 / self.peak
        if self.device.type == "cuda":
            reserved = torch.cuda.max_memory_reserved(self.device)
            m["memory_peak_gib"] = reserved / 2**30
            m["memory_peak_active_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return m

    def _console_line(self, step: int, m: dict[str, float]) -> str:
        parts = [
            self._progress(step),
            f"loss {m['loss']:8.4f}",
            f"grad_norm {m['grad_norm']:7.4f}",
            f"lr {m['lr']:.2e}",
            f"tps {m['tokens_per_second']:,.0f}",
            f"tflops {m['tflops']:.2f}",
        ]
        if self._mfu_key in m:
            label = "mfu(bf16 peak)" if self.float8 else "mfu"
            parts.append(f"{label} {m[self._mfu_key]:.1f}%")
        if "memory_peak_gib" in m:
            parts.append(f"mem {m['memory_peak_gib']:.2f}GiB")
        if "moe_load_imbalance" in m:
            layer = int(m["moe_worst_layer"])
            parts.append(f"moe max/mean {m['moe_load_imbalance']:.2f} (layer {layer})")
        if "moe_aux_loss" in m:
            parts.append(f"aux {m['moe_aux_loss']:.4f}")
        if "document_length" in m:
            parts.append(f"doc_len {m['document_length']:,.0f}")
        parts.append(f"data {m['data_loading_pct']:.1f}%")
        parts.append(f"eta {format_duration((self.total_steps - step) * m['step_seconds'])}")
        return "  ".join(parts)

    def _progress(self, step: int) -> str:
        """``step N/total``, N right-aligned to the width of total."""
        return f"step {step:>{len(str(self.total_steps))}}/{self.total_steps}"

    def _validation_line(self, step: int, m: dict[str, float]) -> str:
        return "  ".join(
            [
                f"validation at {self._progress(step)}",
                f"val_loss {m['val_loss']:8.4f}",
                f"val_perplexity {m['val_perplexity']:,.2f}",
                f"{int(m['val_batches'])} batches, {int(m['val_tokens']):,} tokens",
                f"took {m['val_seconds']:.1f}s",
            ]
        )

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._jsonl is not None:
            self._jsonl.close()
