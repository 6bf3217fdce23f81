"""The trainer: validate, build, train. `python -m torchtitan.train --help` lists the options."""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from torchtitan import exits, runtime
from torchtitan.batch_inputs import BatchInputs, documents_in
from torchtitan.checkpoint import CheckpointManager, TrainState
from torchtitan.checkpoint.hf_load import load_hf_weights
from torchtitan.checkpoint.resume_changes import run_settings
from torchtitan.config import JobConfig, parse_args
from torchtitan.data.loader import Batch, build_dataloader
from torchtitan.fault_tolerance import ReplicaGroup
from torchtitan.float8 import plain_weights, precompute_float8_scales
from torchtitan.loss import build_summed_loss, loss_context, per_step_loss
from torchtitan.metrics import MetricsLogger, StepStats
from torchtitan.model_build import build_model_parts, write_seed_checkpoint
from torchtitan.moe_balance import ExpertBalance
from torchtitan.observability import flight_recorder
from torchtitan.observability.fault_injection import FaultInjector
from torchtitan.observability.numerics import NonFiniteGuard
from torchtitan.observability.profiling import maybe_profile
from torchtitan.optim import build_lr_scheduler, build_optimizer, clip_grad_norm
from torchtitan.parallel.pipeline import microbatch_count
from torchtitan.parallel.tensor_parallel import plain_loss
from torchtitan.validate import ForwardPieces, Validator

logger = logging.getLogger("torchtitan")


class Trainer:
    """Everything one rank trains with, built from the config; ``train()`` runs the steps."""

    def __init__(self, cfg: JobConfig):
        self.cfg = cfg
        self.device, self.rank = runtime.pick_device(), runtime.env_rank()
        self.faults = FaultInjector(self.rank)
        job, self.run_id, self.run_lock = runtime.start_locked_job(cfg)
        self.tokenizer, self.model_args = job.tokenizer, job.model_args
        self.dims, self.accum_steps = job.dims, job.accum_steps
        self.dump_folder = Path(cfg.job.dump_folder)
        self.summed_loss = build_summed_loss(
            cfg.training.logits_loss,
            compiled=cfg.compile.enable and cfg.compile.loss,
            cuda=self.device.type == "cuda",
        )
        self.step_loss = per_step_loss(self.summed_loss, self._loss_tokens)
        if self._moe_meshes_needed():
            # Every rank builds them here, before a pipeline stage without MoE layers skips it.
            self.dims.moe_meshes()
        self.model_parts, self.schedule, self.stage_plan = build_model_parts(
            cfg, self.model_args, self.dims, self.device, self.step_loss
        )
        self.replicas = ReplicaGroup(cfg.fault_tolerance, self.faults)  # inert without FT
        self.balance = self._build_expert_balance()
        self.batch_inputs = BatchInputs(
            self.model_args.attention,
            self.dims,
            self.model_parts,
            cfg.parallelism.context_parallel_rotate_method,
        )
        self.dataloader = self._build_dataloader()
        self._documents = 0  # documents (pieces in a sample) this rank read in the step
        # One optimizer (and lr schedule) per model part: a pipeline rank may hold several stages.
        self.optimizers = [
            build_optimizer(
                part.parameters(), cfg.optimizer, self.device.type, cfg.experimental.compiled_adamw
            )
            for part in self.model_parts
        ]
        self.lr_schedulers = [
            build_lr_scheduler(opt, cfg.training.steps, cfg.lr_scheduler) for opt in self.optimizers
        ]
        self.nonfinite = NonFiniteGuard(cfg.training.on_nonfinite, self.optimizers, logger)
        dp_shares = self.dims.dp_degree * self.replicas.groups
        global_batch = self.accum_steps * cfg.training.local_batch_size * dp_shares
        self.train_state = TrainState(settings=run_settings(cfg, global_batch))
        self.checkpointer = self._build_checkpointer()
        self.step = self.checkpointer.load()
        if cfg.checkpoint.initial_load_in_hf and not self.checkpointer.resumed:
            load_hf_weights(self.model_parts, cfg.checkpoint.initial_load_path, self.model_args)
        self.replicas.start(self)
        self.metrics = self._build_metrics()
        self.validator = self._build_validator() if cfg.validation.enable else None

    def _build_dataloader(self):
        t = self.cfg.training
        dp_rank, dp_shares = self.replicas.data_split(self.dims)
        loader = build_dataloader(
            t.dataset,
            self.tokenizer,
            seq_len=t.seq_len,
            local_batch_size=t.local_batch_size,
            dp_rank=dp_rank,
            dp_world_size=dp_shares,
            text_field=t.text_field,
            num_workers=t.data_workers,
            join_documents=t.join_documents,
            with_positions=True,
        )
        vocab = f"{self.tokenizer.vocab_size:,}"
        logger.info("tokenizer: %s tokens; training data %s", vocab, loader.describe())
        return loader

    def _moe_meshes_needed(self) -> bool:
        moe = getattr(self.model_args, "moe", None) is not None
        return moe and dist.is_initialized() and (self.dims.ep > 1 or self.dims.tp > 1)

    def _expert_load_mesh(self):
        """Where expert loads are summed: every rank whose MoE layers saw other tokens (TP ranks
        too: the layers run on each rank's sequence shard)."""
        return self.dims.moe_meshes().tokens if self._moe_meshes_needed() else self.dims.loss_mesh

    def _build_expert_balance(self) -> ExpertBalance:
        dims, p = self.dims, self.cfg.parallelism
        microbatches = 1
        if dims.pp > 1:
            microbatches = microbatch_count(
                self.cfg.training.local_batch_size, p.pipeline_parallel_microbatch_size
            )
        loads = self._expert_load_mesh() if dist.is_initialized() else None
        balance = ExpertBalance(
            self.model_parts,
            self.model_args.n_layers,
            forwards_per_step=self.accum_steps * microbatches,
            group=loads.get_group() if loads is not None and loads.size() > 1 else None,
            pp_group=dims.mesh("pp").get_group() if dims.pp > 1 else None,
            across_replicas=self.replicas.replica_mean,
        )
        if balance.active:
            logger.info(balance.describe())
        return balance

    def _build_validator(self) -> Validator:
        pieces = ForwardPieces(
            model_parts=self.model_parts,
            stage_plan=self.stage_plan,
            summed_loss=self.summed_loss,
            batch_inputs=self.batch_inputs,
            loss_context=self._loss_context,
            autocast=self._autocast,
        )
        return Validator(self.cfg, self.tokenizer, self.dims, self.device, pieces)

    def _maybe_validate(self, last_step: bool) -> None:
        if self.validator is not None and self.validator.should_run(self.step, last_step):
            self.metrics.record_validation(self.step, self.validator.run())

    def _build_checkpointer(self) -> CheckpointManager:
        return CheckpointManager(
            self.cfg.checkpoint,
            self.cfg.job.dump_folder,
            model_parts=self.model_parts,
            optimizers=self.optimizers,
            lr_schedulers=self.lr_schedulers,
            dataloader=self.dataloader,
            train_state=self.train_state,
            plain_weights=plain_weights if self.cfg.float8.enable else None,
        )

    def _build_metrics(self) -> MetricsLogger:
        cfg = self.cfg
        return MetricsLogger(
            device=self.device,
            flops_per_token=self.model_args.flops_per_token(cfg.training.seq_len),
            total_steps=cfg.training.steps,
            log_freq=cfg.metrics.log_freq,
            dump_folder=self.dump_folder,
            run_id=self.run_id,
            enable_tensorboard=cfg.metrics.enable_tensorboard,
            # Nothing to train (resumed at or past training.steps): no empty metrics files.
            enabled=self.rank == 0 and self.step < cfg.training.steps,
            float8=cfg.float8.enable,
        )

    # ----------------------------------------------------------------------- shapes and contexts

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

    def _loss_context(self):
        """Loss parallel: the loss reads logits sharded over the vocabulary across TP ranks."""
        return loss_context(self.dims.tp > 1 and not self.cfg.parallelism.disable_loss_parallel)

    def _autocast(self):
        """bf16 autocast on GPU where FSDP's mixed precision does not already cast."""
        use_bf16 = (
            self.device.type == "cuda"
            and self.cfg.training.mixed_precision_param == "bfloat16"
            and not self.dims.data_parallel
        )
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=use_bf16)

    # ----------------------------------------------------------------------- one step

    def forward_backward(self, data_iter) -> tuple[torch.Tensor, float]:
        """Accumulate gradients of one optimizer step; -> (mean loss per token, data seconds).

        Every micro-step's summed loss is divided by the tokens of the whole step, so the
        gradients equal those of one large batch; data-parallel averaging of gradients then
        makes them those of the global batch.
        """
        if self.schedule is not None:
            return self._pipelined_forward_backward(data_iter)
        return self._local_forward_backward(data_iter)

    def _local_forward_backward(self, data_iter) -> tuple[torch.Tensor, float]:
        loss = torch.zeros((), device=self.device)
        data_seconds = 0.0
        for _ in range(self.accum_steps):
            batch, seconds = self._next_batch(data_iter)
            data_seconds += seconds
            with self.batch_inputs(*batch) as (inputs, labels, model_kwargs):
                with self._autocast():
                    logits = self.model(inputs, **model_kwargs)
                with self._loss_context():
                    micro_loss = self.step_loss(logits, labels)
                    # The loss's graph keeps what its backward needs; this name would keep the
                    # logits through the head's backward (+0.6 GiB peak at 1B, batch 4 x 8,192).
                    del logits
                    micro_loss = self.faults.poison_loss(self.step, micro_loss)
                    micro_loss.backward()
            loss += plain_loss(micro_loss.detach())
        return self._global_mean(loss), data_seconds

    def _pipelined_forward_backward(self, data_iter) -> tuple[torch.Tensor, float]:
        """Each micro-step runs the schedule over its microbatches; only the rank holding the
        last stage gets losses, so the step's loss is then summed over the pipeline ranks."""
        loss = torch.zeros((), device=self.device)
        data_seconds = 0.0
        for _ in range(self.accum_steps):
            batch, seconds = self._next_batch(data_iter)
            data_seconds += seconds
            losses: list[torch.Tensor] = []
            with self.batch_inputs(*batch) as (inputs, labels, kwargs):
                if self.stage_plan.has_last():
                    kwargs.update(target=labels, losses=losses)
                args = (inputs,) if self.stage_plan.has_first() else ()
                with self._autocast(), self._loss_context():
                    self.schedule.step(*args, **kwargs)
            loss += sum(
                (plain_loss(x.detach()) for x in losses), torch.zeros((), device=self.device)
            )
        dist.all_reduce(loss, group=self.dims.mesh("pp").get_group())
        return self._global_mean(loss), data_seconds

    def _next_batch(self, data_iter) -> tuple[Batch, float]:
        """-> the next batch on the device, and the seconds spent waiting for the loader."""
        start = time.perf_counter()
        batch = next(data_iter)
        seconds = time.perf_counter() - start
        self._documents += documents_in(batch.positions)
        return Batch(*(t.to(self.device, non_blocking=True) for t in batch)), seconds

    def _global_mean(self, local: torch.Tensor) -> torch.Tensor:
        """Average of a per-rank value over all data-parallel (and context-parallel) ranks."""
        if dist.is_initialized() and self.dims.loss_mesh.size() > 1:
            mesh = self.dims.loss_mesh
            local = local.clone()
            if not self.faults.skip_collective(self.step):
                dist.all_reduce(local, group=mesh.get_group())
            local /= mesh.size()
        return local

    def train_step(self, data_iter) -> StepStats:
        precompute_float8_scales(self.model_parts, self.cfg.float8)
        loss, data_seconds = self.forward_backward(data_iter)
        loss = self.replicas.replica_mean(loss)
        params = [p for part in self.model_parts for p in part.parameters()]
        pp_group = self.dims.mesh("pp").get_group() if self.dims.pp > 1 else None
        # Earlier steps' non-finite flags, those already on the host: no wait for the GPU.
        self.nonfinite.resolve()
        grad_norm = clip_grad_norm(params, self.cfg.training.max_norm, pp_group, self.optimizers)
        lr = self.optimizers[0].param_groups[0]["lr"]  # what this step uses
        loads = self.balance.collect_loads() if self.balance.active else None  # before commit
        # Both values are global (data-parallel mean loss, global norm): every rank decides alike.
        commit = self.replicas.should_commit(self.step)  # False: a group died in the exchange
        apply_update = commit and self.nonfinite.before_optimizer_step(self.step, loss, grad_norm)
        for optimizer, lr_scheduler in zip(self.optimizers, self.lr_schedulers):
            if apply_update:
                optimizer.step()
            if commit:  # an uncommitted step runs again, at the same lr
                lr_scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        extra = self.balance.after_step(loads, apply_update) if loads is not None else {}
        extra["document_length"] = self._tokens_per_step / max(self._documents, 1)
        extra.update(self.replicas.step_metrics(self.step))
        self._documents = 0
        return StepStats(
            step=self.step,
            loss=loss,
            grad_norm=grad_norm,
            lr=lr,
            # A data-parallel group's tokens are processed by its tp x cp x pp devices together.
            tokens=self._tokens_per_step // self.dims.model_parallel_size,
            data_seconds=data_seconds,
            data_windows=self.dataloader.windows,
            extra=extra,
        )

    # ----------------------------------------------------------------------- the loop

    def train(self) -> list[float]:
        """Run to training.steps; returns the loss of every step."""
        t = self.cfg.training
        if self.step >= t.steps:
            logger.warning(
                "checkpoint step-%d is at or past training.steps=%d: nothing to train; raise "
                "--training.steps to continue",
                self.step,
                t.steps,
            )
            self.checkpointer.close()
            return []
        logger.info(
            "training %d steps: %d x %d tokens per micro-step, %d micro-steps per step",
            t.steps,
            t.local_batch_size,
            t.seq_len,
            self.accum_steps,
        )
        first = self.step
        # Device-side loss history: read once at the end, not with a sync per step.
        history = torch.full((t.steps - first,), float("nan"), device=self.device)
        # After checkpointer.load(): the loader applies a loaded state to the next iterator.
        data_iter = iter(self.dataloader)
        with self._loop_guards() as (profiler, preemption):
            while self.step < t.steps:
                # Fault tolerance: a rejoining group continues from the live groups' step.
                self.step, data_iter = self.replicas.begin_step(self.step, data_iter)
                self.step += 1
                if self.step % t.gc_freq == 0:
                    gc.collect(1)
                self.faults.at_step_start(self.step)
                stats = self.train_step(data_iter)
                if not self.replicas.committed:
                    continue
                profiler.step()
                history[self.step - first - 1] = stats.loss
                saved = self._finish_step(stats, first_step=self.step == first + 1)
                if stop_signal := preemption.requested():
                    self.nonfinite.resolve(wait=True)
                    self._stop_for_preemption(saved, stop_signal)
        self.nonfinite.resolve(wait=True)
        self.checkpointer.close()
        losses = history.tolist()
        logger.info("training done: %d steps, final loss %.4f", self.step, losses[-1])
        return losses

    @contextlib.contextmanager
    def _loop_guards(self):
        """Flight Recorder dumps on communication failures, the profiler, and SIGTERM/Ctrl-C
        handling around the loop; -> (profiler, preemption guard)."""
        traces = flight_recorder.trace_folder(self.cfg.comm, self.cfg.job.dump_folder)
        record = dist.is_initialized() and self.cfg.comm.trace_buf_size > 0
        with (
            flight_recorder.dump_on_failure(
                traces,
                enabled=record,
                handle_sigterm=False,
                dump_if=runtime.needs_flight_recorder_dump,
            ),
            maybe_profile(self.cfg.profiling, self.dump_folder, self.rank, self.step) as profiler,
            runtime.PreemptionGuard(self.cfg.comm.init_timeout_seconds) as preemption,
        ):
            yield profiler, preemption

    def _finish_step(self, stats: StepStats, first_step: bool) -> bool:
        """Log, validate, checkpoint after a step; -> whether a checkpoint was saved."""
        last_step = self.step == self.cfg.training.steps
        if self.metrics.should_log(self.step) or self.checkpointer.should_save(
            self.step, last_step
        ):
            self.nonfinite.resolve(wait=True)  # nothing is logged or saved past a bad step
        self.metrics.record(stats)
        self._maybe_validate(last_step)
        self.train_state.step = self.step
        group_tokens = self._tokens_per_step * self.dims.dp_degree
        self.train_state.tokens_seen += group_tokens * self.replicas.live_replicas
        saved = self.checkpointer.save(self.step, last_step=last_step)
        if first_step and dist.is_initialized():
            flight_recorder.set_train_timeout(self.cfg.comm.train_timeout_seconds)
        return saved

    def _stop_for_preemption(self, saved: bool, signum: int) -> None:
        if not saved:
            saved = self.checkpointer.save(self.step, force=True)
        self.checkpointer.close()
        where = f"checkpoint step-{self.step} saved" if saved else "checkpointing is off"
        line = f"{runtime.stop_signal_name(signum)}: stopping after step {self.step} ({where})"
        logger.warning(line)
        raise runtime.Preempted(self.step, signum, line)

    def close(self) -> None:
        self.replicas.close()
        self.metrics.close()
        runtime.shutdown_process(self.run_lock)


def main(argv: list[str] | None = None) -> int:
    """Train; -> the exit code. Every ending but a bug is one line (see ``torchtitan.exits``)."""
    runtime.setup_logging(runtime.env_rank())
    cfg = trainer = None
    runtime.LauncherWatch().start()  # until the process ends
    try:
        cfg = parse_args(argv)
        if cfg.checkpoint.create_seed_checkpoint:
            write_seed_checkpoint(cfg)
            return 0
        trainer = Trainer(cfg)
        trainer.train()
    except BaseException as error:
        traces = flight_recorder.trace_folder(cfg.comm, cfg.job.dump_folder) if cfg else None
        code = exits.finish(error, trainer.step if trainer else None, traces)
        if code is None:
            raise
        return code
    finally:
        if trainer is not None:
            trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
