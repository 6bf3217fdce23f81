"""The trainer: validate, build, train. `python -m torchtitan.train --help` lists the options."""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from torchtitan.checkpoint import load_model_weights, save_seed_checkpoint
from torchtitan.config import JobConfig, parse_args
from torchtitan.data.loader import build_dataloader
from torchtitan.loss import cross_entropy_sum, loss_context
from torchtitan.metrics import MetricsLogger, StepStats
from torchtitan.models.llama3 import Transformer
from torchtitan.optim import build_lr_scheduler, build_optimizer, clip_grad_norm
from torchtitan.parallel.activation_checkpoint import apply_ac
from torchtitan.parallel.compile import apply_compile, use_per_rank_compile_cache
from torchtitan.parallel.parallelize import parallelize_llama
from torchtitan.preflight import USER_ERRORS, check_job, seed_checkpoint_path

logger = logging.getLogger("torchtitan")


def setup_logging(rank: int) -> None:
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


class Trainer:
    def __init__(self, cfg: JobConfig):
        self.cfg = cfg
        self.device = pick_device()
        self.rank = env_rank()
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        checked = check_job(cfg, self.world_size)
        self.tokenizer, self.model_args = checked.tokenizer, checked.model_args
        self.dims, self.accum_steps = checked.dims, checked.accum_steps
        self.run_id = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.dump_folder = Path(cfg.job.dump_folder)
        self._init_runtime()
        self._save_effective_config()
        self.model = self._build_model()
        if cfg.checkpoint.create_seed_checkpoint:
            return
        self.dataloader = build_dataloader(
            cfg.training.dataset,
            self.tokenizer,
            seq_len=cfg.training.seq_len,
            local_batch_size=cfg.training.local_batch_size,
            dp_rank=self.dims.dp_rank if dist.is_initialized() else 0,
            dp_world_size=self.dims.dp_degree,
            text_field=cfg.training.text_field,
        )
        self.optimizer = build_optimizer(self.model.parameters(), cfg.optimizer, self.device.type)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, cfg.training.steps, cfg.lr_scheduler)
        self.loss_fn = cross_entropy_sum
        if cfg.compile.enable and cfg.compile.loss:
            self.loss_fn = torch.compile(cross_entropy_sum)
        self.metrics = MetricsLogger(
            device=self.device,
            flops_per_token=self.model_args.flops_per_token(cfg.training.seq_len),
            total_steps=cfg.training.steps,
            log_freq=cfg.metrics.log_freq,
            dump_folder=self.dump_folder,
            run_id=self.run_id,
            enable_tensorboard=cfg.metrics.enable_tensorboard,
            enabled=self.rank == 0,
        )
        self.step = 0

    # ----------------------------------------------------------------------- building

    def _init_runtime(self) -> None:
        t = self.cfg.training
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if "WORLD_SIZE" in os.environ and not dist.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            timeout = timedelta(seconds=self.cfg.comm.init_timeout_seconds)
            dist.init_process_group(backend, timeout=timeout)
        if dist.is_initialized():
            self.dims.build_mesh(self.device.type)
            if self.cfg.compile.enable:
                use_per_rank_compile_cache(self.rank)
        torch.manual_seed(t.seed)
        if t.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
            torch.backends.cudnn.benchmark = False
        gc.disable()
        gc.collect(1)

    def _save_effective_config(self) -> None:
        text = self.cfg.to_toml()
        logger.info("effective config:\n%s", text)
        if self.rank == 0:
            folder = self.dump_folder / "configs"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{self.run_id}.toml").write_text(text)

    def _build_model(self) -> nn.Module:
        start = time.perf_counter()
        args, cfg = self.model_args, self.cfg
        with torch.device("meta"):
            model = Transformer(args)
        if cfg.checkpoint.create_seed_checkpoint:
            model.to_empty(device="cpu")
            model.init_weights()
            save_seed_checkpoint(model, seed_checkpoint_path(cfg))
            return model
        if dist.is_initialized():
            parallelize_llama(model, self.dims, cfg, self.device.type)
        else:
            ac = cfg.activation_checkpoint
            apply_ac(model, ac.mode, ac.selective_ac_option)
            if cfg.compile.enable:
                apply_compile(model)
        model.to_empty(device=self.device)
        model.init_weights()
        if cfg.checkpoint.initial_load_path:
            load_model_weights(model, cfg.checkpoint.initial_load_path)
        logger.info(
            "built %s %s: %s parameters, %.2f GFLOPs/token at seq_len %d, %s, on %s in %.1fs",
            cfg.model.name,
            cfg.model.flavor,
            f"{args.num_params():,}",
            args.flops_per_token(cfg.training.seq_len) / 1e9,
            cfg.training.seq_len,
            self.dims.describe(),
            self.device,
            time.perf_counter() - start,
        )
        return model

    @property
    def _vocab_sharded_logits(self) -> bool:
        return self.dims.tp > 1 and not self.cfg.parallelism.disable_loss_parallel

    def _autocast(self):
        """bf16 autocast on GPU where FSDP's mixed precision does not already cast."""
        use_bf16 = (
            self.device.type == "cuda"
            and self.cfg.training.mixed_precision_param == "bfloat16"
            and not self.dims.data_parallel
        )
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=use_bf16)

    # ----------------------------------------------------------------------- training

    def forward_backward(self, data_iter) -> tuple[torch.Tensor, float]:
        """Accumulate gradients of one optimizer step; -> (mean loss per token, data seconds).

        Every micro-step's summed loss is divided by the tokens of the whole step, so the
        gradients equal those of one large batch; data-parallel averaging of gradients then
        makes them those of the global batch.
        """
        t = self.cfg.training
        tokens = self.accum_steps * t.local_batch_size * t.seq_len
        loss_sum = torch.zeros((), device=self.device)
        data_seconds = 0.0
        for _ in range(self.accum_steps):
            start = time.perf_counter()
            inputs, labels = next(data_iter)
            data_seconds += time.perf_counter() - start
            inputs, labels = inputs.to(self.device), labels.to(self.device)
            with self._autocast():
                logits = self.model(inputs)
            with loss_context(self._vocab_sharded_logits):
                micro_loss = self.loss_fn(logits, labels)
                (micro_loss / tokens).backward()
            micro_loss = micro_loss.detach()
            if isinstance(micro_loss, DTensor):  # loss parallel: replicated over TP
                micro_loss = micro_loss.full_tensor()
            loss_sum += micro_loss
        return self._global_mean(loss_sum / tokens), data_seconds

    def _global_mean(self, local: torch.Tensor) -> torch.Tensor:
        """Average of a per-rank value over all data-parallel (and context-parallel) ranks."""
        if dist.is_initialized() and self.dims.loss_mesh.size() > 1:
            mesh = self.dims.loss_mesh
            local = local.clone()
            dist.all_reduce(local, group=mesh.get_group())
            local /= mesh.size()
        return local

    def train_step(self, data_iter) -> StepStats:
        loss, data_seconds = self.forward_backward(data_iter)
        grad_norm = clip_grad_norm(list(self.model.parameters()), self.cfg.training.max_norm)
        lr = self.lr_scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        t = self.cfg.training
        return StepStats(
            step=self.step,
            loss=loss.item(),
            grad_norm=grad_norm.item(),
            lr=lr,
            # A data-parallel group's tokens are processed by its tp x cp x pp devices together.
            tokens=self.accum_steps
            * t.local_batch_size
            * t.seq_len
            // self.dims.model_parallel_size,
            data_seconds=data_seconds,
        )

    def train(self) -> list[float]:
        """Run to training.steps; returns the loss of every step."""
        t = self.cfg.training
        logger.info(
            "training %d steps: %d x %d tokens per micro-step, %d micro-steps per step",
            t.steps,
            t.local_batch_size,
            t.seq_len,
            self.accum_steps,
        )
        losses = []
        data_iter = iter(self.dataloader)
        while self.step < t.steps:
            self.step += 1
            if self.step % t.gc_freq == 0:
                gc.collect(1)
            stats = self.train_step(data_iter)
            losses.append(stats.loss)
            self.metrics.record(stats)
        logger.info("training done: %d steps, final loss %.4f", self.step, losses[-1])
        return losses

    def close(self) -> None:
        if hasattr(self, "metrics"):
            self.metrics.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    setup_logging(env_rank())
    trainer = None
    try:
        trainer = Trainer(parse_args(argv))
        if not trainer.cfg.checkpoint.create_seed_checkpoint:
            trainer.train()
    except USER_ERRORS as e:
        logger.error("error: %s", e)
        return 2
    except KeyboardInterrupt:
        logger.warning("interrupted at step %s", trainer.step if trainer else 0)
        return 130
    finally:
        if trainer is not None:
            trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
