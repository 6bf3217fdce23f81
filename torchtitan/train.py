"""The trainer: validate, build, train. `python -m torchtitan.train --help` lists the options."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from torchtitan.checkpoint import CheckpointManager, TrainState, save_seed_checkpoint
from torchtitan.config import JobConfig, parse_args
from torchtitan.data.loader import build_dataloader
from torchtitan.loss import cross_entropy_sum, loss_context
from torchtitan.metrics import MetricsLogger, StepStats
from torchtitan.models.llama3 import Transformer
from torchtitan.models.llama3.hf import load_hf_weights
from torchtitan.observability import flight_recorder
from torchtitan.observability.fault_injection import maybe_inject
from torchtitan.observability.numerics import NonFiniteError, check_finite
from torchtitan.observability.profiling import maybe_profile
from torchtitan.optim import build_lr_scheduler, build_optimizer, clip_grad_norm
from torchtitan.parallel.activation_checkpoint import apply_ac
from torchtitan.parallel.compile import apply_compile, use_per_rank_compile_cache
from torchtitan.parallel.context_parallel import cp_context
from torchtitan.parallel.float8 import apply_float8, precompute_float8_scales
from torchtitan.parallel.parallelize import parallelize_llama
from torchtitan.parallel.pipeline import (
    StagePlan,
    build_pipeline_stage,
    build_schedule,
    build_stage_module,
    microbatch_count,
    plan_stages,
)
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
        # Unique per launch (a quick restart must not append to the previous run's files).
        self.run_id = f"{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"
        self.dump_folder = Path(cfg.job.dump_folder)
        self._init_runtime()
        self._save_effective_config()
        if cfg.checkpoint.create_seed_checkpoint:
            self._write_seed_checkpoint()
            return
        self.loss_fn = cross_entropy_sum
        if cfg.compile.enable and cfg.compile.loss:
            self.loss_fn = torch.compile(cross_entropy_sum)
        self.model_parts, self.schedule, self.stage_plan = self._build_model()
        self.dataloader = build_dataloader(
            cfg.training.dataset,
            self.tokenizer,
            seq_len=cfg.training.seq_len,
            local_batch_size=cfg.training.local_batch_size,
            dp_rank=self.dims.dp_rank if dist.is_initialized() else 0,
            dp_world_size=self.dims.dp_degree,
            text_field=cfg.training.text_field,
        )
        # One optimizer (and lr schedule) per model part: a pipeline rank may hold several stages.
        self.optimizers = [
            build_optimizer(part.parameters(), cfg.optimizer, self.device.type)
            for part in self.model_parts
        ]
        self.lr_schedulers = [
            build_lr_scheduler(opt, cfg.training.steps, cfg.lr_scheduler) for opt in self.optimizers
        ]
        self.train_state = TrainState()
        self.checkpointer = CheckpointManager(
            cfg.checkpoint,
            cfg.job.dump_folder,
            model_parts=self.model_parts,
            optimizers=self.optimizers,
            lr_schedulers=self.lr_schedulers,
            dataloader=self.dataloader,
            train_state=self.train_state,
        )
        self.step = self.checkpointer.load()
        if cfg.checkpoint.initial_load_in_hf and not self.checkpointer.resumed:
            load_hf_weights(self.model_parts, cfg.checkpoint.initial_load_path, self.model_args)
        self.metrics = MetricsLogger(
            device=self.device,
            flops_per_token=self.model_args.flops_per_token(cfg.training.seq_len),
            total_steps=cfg.training.steps,
            log_freq=cfg.metrics.log_freq,
            dump_folder=self.dump_folder,
            run_id=self.run_id,
            enable_tensorboard=cfg.metrics.enable_tensorboard,
            enabled=self.rank == 0,
            float8=cfg.float8.enable,
        )

    # ----------------------------------------------------------------------- building

    def _init_runtime(self) -> None:
        t = self.cfg.training
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if "WORLD_SIZE" in os.environ and not dist.is_initialized():
            flight_recorder.configure_env(self.cfg.comm, self.cfg.job.dump_folder)
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            timeout = timedelta(seconds=self.cfg.comm.init_timeout_seconds)
            dist.init_process_group(backend, timeout=timeout, **_restart_safe_store(timeout))
        if dist.is_initialized():
            self.dims.build_mesh(self.device.type)
            # Mesh sub-groups get the backend's default timeout, not init_process_group's.
            flight_recorder.set_timeout(self.cfg.comm.init_timeout_seconds)
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

    def _write_seed_checkpoint(self) -> None:
        """The whole model's initial weights, from one process on CPU (the parity baseline)."""
        with torch.device("meta"):
            model = Transformer(self.model_args)
        model.to_empty(device="cpu")
        model.init_weights()
        save_seed_checkpoint(model, seed_checkpoint_path(self.cfg))

    def _build_model(self) -> tuple[list[nn.Module], object, StagePlan | None]:
        """-> (model parts on this rank, pipeline schedule or None, stage plan or None)."""
        start = time.perf_counter()
        args, cfg = self.model_args, self.cfg
        with torch.device("meta"):
            model = Transformer(args)
        schedule, plan = None, None
        if self.dims.pp > 1:
            parts, schedule, plan = self._build_pipeline(model)
        else:
            parts = [self._parallelize(model)]
        for part in parts:
            part.to_empty(device=self.device)
            part.init_weights()
        logger.info(
            "built %s %s: %s parameters, %.2f GFLOPs/token at seq_len %d, %s%s, on %s in %.1fs",
            cfg.model.name,
            cfg.model.flavor,
            f"{args.num_params():,}",
            args.flops_per_token(cfg.training.seq_len) / 1e9,
            cfg.training.seq_len,
            self.dims.describe(),
            f", stages {plan.stage_ids} of {plan.num_stages}" if plan else "",
            self.device,
            time.perf_counter() - start,
        )
        return parts, schedule, plan

    def _parallelize(self, model: nn.Module) -> nn.Module:
        cfg = self.cfg
        if dist.is_initialized():
            return parallelize_llama(model, self.dims, cfg, self.device.type)
        if cfg.float8.enable:
            apply_float8(model, cfg.float8)
        ac = cfg.activation_checkpoint
        apply_ac(model, ac.mode, ac.selective_ac_option, save_matmuls=ac.save_matmuls)
        if cfg.compile.enable:
            apply_compile(model)
        return model

    def _build_pipeline(self, model: nn.Module):
        p, t = self.cfg.parallelism, self.cfg.training
        pp_mesh = self.dims.mesh("pp")
        plan = plan_stages(
            self.model_args.n_layers,
            self.dims.pp,
            pp_mesh.get_local_rank(),
            p.pipeline_parallel_schedule,
            p.pipeline_parallel_stages_per_rank,
            p.pipeline_parallel_split_points,
            p.pipeline_parallel_layers_per_stage,
        )
        parts, stages = [], []
        for stage_id in plan.stage_ids:
            first, last = stage_id == 0, stage_id == plan.num_stages - 1
            part = build_stage_module(model, plan.layers[stage_id], first, last)
            part = self._parallelize(part)
            parts.append(part)
            stages.append(
                build_pipeline_stage(part, stage_id, plan, self.device, pp_mesh.get_group())
            )
        n_microbatches = microbatch_count(t.local_batch_size, p.pipeline_parallel_microbatch_size)
        schedule = build_schedule(
            p.pipeline_parallel_schedule,
            stages,
            n_microbatches,
            self._pipeline_loss,
            p.pipeline_parallel_schedule_csv,
        )
        return parts, schedule, plan

    def _pipeline_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """A microbatch's summed loss over the step's tokens: the microbatch losses then add up
        to the step's mean loss, as in the non-pipelined path."""
        return self.loss_fn(logits, labels) / self._loss_tokens

    @property
    def model(self) -> nn.Module:
        """The model, where it is one module (no pipeline parallelism)."""
        (part,) = self.model_parts
        return part

    @property
    def _tokens_per_step(self) -> int:
        """Tokens one data-parallel rank trains on per optimizer step."""
        t = self.cfg.training
        return self.accum_steps * t.local_batch_size * t.seq_len

    @property
    def _loss_tokens(self) -> int:
        """Tokens this rank's summed loss covers: a context-parallel rank sees 1/cp of each
        sequence. Dividing by it, FSDP's gradient average over dp x cp gives the global mean."""
        return self._tokens_per_step // self.dims.cp

    def _cp_context(self, inputs: torch.Tensor, labels: torch.Tensor):
        """Shard inputs, labels and the RoPE caches on the sequence dim (ring attention)."""
        if self.dims.cp == 1:
            return contextlib.nullcontext()
        caches = [part.rope_cache for part in self.model_parts]
        return cp_context(
            self.dims.mesh("cp"),
            [inputs, labels, *caches],
            [1, 1, *[0] * len(caches)],
            rotate_method=self.cfg.parallelism.context_parallel_rotate_method,
        )

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
        tokens = self._loss_tokens
        loss = torch.zeros((), device=self.device)
        data_seconds = 0.0
        for _ in range(self.accum_steps):
            start = time.perf_counter()
            inputs, labels = next(data_iter)
            data_seconds += time.perf_counter() - start
            inputs, labels = inputs.to(self.device), labels.to(self.device)
            if self.schedule is not None:
                with self._cp_context(inputs, labels):
                    loss += self._pipeline_step(inputs, labels)
                continue
            with self._cp_context(inputs, labels):
                with self._autocast():
                    logits = self.model(inputs)
                with loss_context(self._vocab_sharded_logits):
                    micro_loss = self.loss_fn(logits, labels) / tokens
                    if maybe_inject("nan_loss", self.step, self.rank):
                        micro_loss = micro_loss * float("nan")
                    micro_loss.backward()
            loss += _local(micro_loss.detach())
        if self.schedule is not None:
            loss = self._from_last_stage(loss)
        return self._global_mean(loss), data_seconds

    def _pipeline_step(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Run the schedule over one micro-step's microbatches; -> this rank's loss share
        (non-zero only on the rank holding the last stage)."""
        losses: list[torch.Tensor] = []
        kwargs = {}
        if self.stage_plan.has_last():
            kwargs = dict(target=labels, losses=losses)
        args = (inputs,) if self.stage_plan.has_first() else ()
        with self._autocast(), loss_context(self._vocab_sharded_logits):
            self.schedule.step(*args, **kwargs)
        return sum((_local(x.detach()) for x in losses), torch.zeros((), device=self.device))

    def _from_last_stage(self, loss: torch.Tensor) -> torch.Tensor:
        """The last stage's loss on every pipeline rank (others contribute 0), so rank 0 logs it."""
        dist.all_reduce(loss, group=self.dims.mesh("pp").get_group())
        return loss

    def _global_mean(self, local: torch.Tensor) -> torch.Tensor:
        """Average of a per-rank value over all data-parallel (and context-parallel) ranks."""
        if dist.is_initialized() and self.dims.loss_mesh.size() > 1:
            mesh = self.dims.loss_mesh
            local = local.clone()
            if not maybe_inject("skip_collective", self.step, self.rank):
                dist.all_reduce(local, group=mesh.get_group())
            local /= mesh.size()
        return local

    def train_step(self, data_iter) -> StepStats:
        maybe_inject("delay", self.step, self.rank)
        precompute_float8_scales(self.model_parts, self.cfg.float8)
        loss, data_seconds = self.forward_backward(data_iter)
        params = [p for part in self.model_parts for p in part.parameters()]
        pp_group = self.dims.mesh("pp").get_group() if self.dims.pp > 1 else None
        grad_norm = clip_grad_norm(params, self.cfg.training.max_norm, pp_group)
        lr = self.lr_schedulers[0].get_last_lr()[0]
        # Both values are global (data-parallel mean loss, global norm): every rank decides alike.
        loss_value, norm_value = loss.item(), grad_norm.item()
        skip = check_finite(loss_value, norm_value, self.step, self.cfg.training.on_nonfinite)
        if skip == "skip":
            logger.warning(
                "step %d skipped: non-finite loss %g or grad norm %g",
                self.step,
                loss_value,
                norm_value,
            )
        for optimizer, lr_scheduler in zip(self.optimizers, self.lr_schedulers):
            if skip != "skip":
                optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        return StepStats(
            step=self.step,
            loss=loss_value,
            grad_norm=norm_value,
            lr=lr,
            # A data-parallel group's tokens are processed by its tp x cp x pp devices together.
            tokens=self._tokens_per_step // self.dims.model_parallel_size,
            data_seconds=data_seconds,
            data_windows=self.dataloader.dataset.state_dict()["windows"],
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
        # After checkpointer.load(): the loader applies a loaded state to the next iterator.
        data_iter = iter(self.dataloader)
        traces = flight_recorder.trace_folder(self.cfg.comm, self.cfg.job.dump_folder)
        record = dist.is_initialized() and self.cfg.comm.trace_buf_size > 0
        with (
            flight_recorder.dump_on_failure(traces, enabled=record, handle_sigterm=False),
            maybe_profile(self.cfg.profiling, self.dump_folder, self.rank, self.step) as profiler,
            PreemptionGuard(self.cfg.comm.init_timeout_seconds) as preemption,
        ):
            first_step = True
            while self.step < t.steps:
                self.step += 1
                if self.step % t.gc_freq == 0:
                    gc.collect(1)
                maybe_inject("crash", self.step, self.rank)
                maybe_inject("kill", self.step, self.rank)
                stats = self.train_step(data_iter)
                profiler.step()
                losses.append(stats.loss)
                self.metrics.record(stats)
                self.train_state.step = self.step
                self.train_state.tokens_seen += self._tokens_per_step * self.dims.dp_degree
                saved = self.checkpointer.save(self.step, last_step=self.step == t.steps)
                if first_step and dist.is_initialized():
                    flight_recorder.set_train_timeout(self.cfg.comm.train_timeout_seconds)
                    first_step = False
                if preemption.requested():
                    self._stop_for_preemption(saved)
        self.checkpointer.close()
        if losses:
            logger.info("training done: %d steps, final loss %.4f", self.step, losses[-1])
        return losses

    def _stop_for_preemption(self, saved: bool) -> None:
        if not saved:
            saved = self.checkpointer.save(self.step, force=True)
        self.checkpointer.close()
        where = f"checkpoint step-{self.step} saved" if saved else "checkpointing is off"
        logger.warning("SIGTERM: stopping after step %d (%s)", self.step, where)
        raise Preempted(self.step)

    def close(self) -> None:
        if hasattr(self, "metrics"):
            self.metrics.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.enable()


class Preempted(SystemExit):
    """SIGTERM was handled: progress is saved (step >= 1), or the step could not finish because
    another rank is gone (step -1); the process exits with 143."""

    def __init__(self, step: int):
        super().__init__(143)
        self.step = step


class PreemptionGuard:
    """Turns SIGTERM into a flag the loop checks after each step; all ranks agree on it.

    torchrun also sends SIGTERM when another rank failed; then the step never finishes (or the
    vote never completes), so GRACE_SECONDS after the signal the main thread gets SIGUSR1, which
    raises ``Preempted`` there (a real signal also wakes a sleeping or waiting main thread): the
    Flight Recorder dumps and the process exits before torchrun's SIGKILL, 30 s after its SIGTERM.
    """

    GRACE_SECONDS = 20

    def __init__(self, timeout_seconds: int):
        self.timeout = timedelta(seconds=timeout_seconds)
        self._watchdog: threading.Timer | None = None

    def __enter__(self):
        self._flag = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._previous_usr1 = signal.signal(signal.SIGUSR1, self._on_sigusr1)
        # Its own CPU group: the per-step vote must not queue behind NCCL work.
        self._group = (
            dist.new_group(backend="gloo", timeout=self.timeout) if dist.is_initialized() else None
        )
        return self

    def _on_sigterm(self, signum, frame):
        self._flag = True
        if self._watchdog is None:
            self._watchdog = threading.Timer(self.GRACE_SECONDS, self._interrupt_main)
            self._watchdog.daemon = True
            self._watchdog.start()

    @staticmethod
    def _interrupt_main() -> None:
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    @staticmethod
    def _on_sigusr1(signum, frame):
        raise Preempted(-1)

    def requested(self) -> bool:
        if not dist.is_initialized():
            return self._flag
        flag = torch.tensor([float(self._flag)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        if flag.item() and self._watchdog is not None:
            self._watchdog.cancel()  # every rank is alive and agreed: take the time to save
        return bool(flag.item())

    def __exit__(self, *exc):
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            signal.signal(signal.SIGUSR1, self._previous_usr1)
        return False


def _restart_safe_store(timeout: timedelta) -> dict:
    """``init_process_group`` arguments that keep a torchrun restart off the last attempt's keys.

    torchrun's agent hosts one TCPStore for the whole job and every attempt's workers connect to
    it (``TORCHELASTIC_USE_AGENT_STORE``, same ``MASTER_PORT``), but ``env://`` does not prefix
    the keys per attempt (torch >= 2.4). A restarted rank then reads the previous attempt's gloo
    addresses (``default_pg/0/.../rank_<r>``) and connects to a dead port ("Gloo connectFullMesh
    failed ... Connection refused"), or finds stale barrier counts. Prefixing the store with
    ``TORCHELASTIC_RESTART_COUNT`` (what torch < 2.4 did) gives each attempt its own keys.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timeout,
    )
    return {
        "store": dist.PrefixStore(f"/worker/attempt_{attempt}/default_pg", store),
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
    }


def _local(loss: torch.Tensor) -> torch.Tensor:
    """Loss parallel returns the loss as a DTensor replicated over TP; the value is the same."""
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


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
    except NonFiniteError as e:
        logger.error("error: %s", e)
        return 3
    except KeyboardInterrupt:
        logger.warning("interrupted at step %s", trainer.step if trainer else 0)
        return 130
    finally:
        if trainer is not None:
            trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
