"""``ReplicaGroup``: this replica group's side of fault-tolerant training, the one object the
trainer calls (inert when ``[fault_tolerance] enable`` is off).

Per step, synchronous (``semi_sync none``): ``begin_step`` joins the quorum (a group that comes
back heals here from a live peer, before its forward), the backward averages gradients across
the live groups (``gradients.py``), ``replica_mean`` averages the loss, and ``should_commit``
says whether the step counts: when a group died during the exchange, the others' collectives
failed, no group commits, and the step is run again (with the next batch) by the groups still
alive; a group that dies after the exchange leaves the others a complete step, which they commit
(torchft's commit vote is among the ranks of one group). The lr schedule steps with committed
steps only. Semi-synchronous (``local_sgd``, ``diloco``): every step is local and commits; the
groups meet every ``sync_every`` steps inside the optimizer step (``semi_sync.py``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from torchtitan.config import ConfigError, FaultTolerance
from torchtitan.fault_tolerance.gradients import average_across_replicas
from torchtitan.fault_tolerance.live_state import LiveState
from torchtitan.fault_tolerance.probe import WeightsProbe
from torchtitan.observability.fault_injection import FaultInjector
from torchtitan.parallel.dims import ParallelDims

if TYPE_CHECKING:
    from torchtitan.train import Trainer

logger = logging.getLogger("torchtitan")


class ReplicaGroup:
    def __init__(self, cfg: FaultTolerance, faults: FaultInjector | None = None):
        self.cfg = cfg
        self.faults = faults or FaultInjector(0, faults=())
        self.enabled = cfg.enable
        self.groups = cfg.group_size if cfg.enable else 1
        self.semi_sync = cfg.semi_sync != "none"
        self.live_replicas = self.groups
        self.committed = True
        self.manager = None
        self._live: LiveState | None = None
        self._semi_sync = None
        self._probe: WeightsProbe | None = None
        self._exchanged = 0  # elements all-reduced across groups, up to the last step
        self._tokens_per_group = 0  # tokens one group trains on per step

    def data_split(self, dims: ParallelDims) -> tuple[int, int]:
        """(this rank's share, shares) of the global data stream: the stream is split over
        replica groups x data-parallel ranks, as HSDP splits it over replicate x shard."""
        dp_rank = dims.dp_rank if dist.is_initialized() else 0
        replica = self.cfg.replica_id if self.enabled else 0
        return replica * dims.dp_degree + dp_rank, self.groups * dims.dp_degree

    def start(self, trainer: Trainer) -> None:
        """Join the replica groups, once ``trainer`` has loaded its checkpoint (or seed): its
        model parts, optimizers, lr schedulers, data loader and train state become the live
        state a rejoining group takes. When every group loaded the same checkpoint no weights
        are sent at step 0; otherwise the groups start from one group's initial weights."""
        if not self.enabled:
            return
        if not dist.is_initialized():
            raise ConfigError(
                "--fault_tolerance.enable needs a torchrun launch of each replica group "
                "(run_train.sh or scripts/fault_tolerant_local.sh), also with one process"
            )
        from torchtitan.fault_tolerance.manager import build_manager

        self.faults.at_point("join", trainer.step)
        loaded = bool(trainer.cfg.checkpoint.initial_load_path) or trainer.checkpointer.resumed
        self.manager = build_manager(self.cfg, trainer.device, init_sync=not loaded)
        model_parts, optimizers, step = trainer.model_parts, trainer.optimizers, trainer.step
        self._live = LiveState(
            model_parts,
            optimizers,
            trainer.lr_schedulers,
            trainer.dataloader,
            trainer.train_state,
        )
        self._live.progress = step
        t = trainer.cfg.training
        tokens_per_rank = trainer.accum_steps * t.local_batch_size * t.seq_len
        self._tokens_per_group = tokens_per_rank * trainer.dims.dp_degree
        self.manager.register_state_dict_fn(
            "torchtitan", self._live.load_state_dict, self._live.state_dict
        )
        # torchft counts committed steps: one per step, or one per synchronization.
        synced = step // self.cfg.sync_every if self.semi_sync else step
        self.manager.load_state_dict({"step": synced, "batches_committed": 0})
        self._probe = WeightsProbe.from_env(self.cfg.replica_id, dist.get_rank(), model_parts)
        self._record("start", step)
        logger.info(
            "fault tolerance: replica group %d of %d, %s",
            self.cfg.replica_id,
            self.groups,
            self._install_exchange(model_parts, optimizers),
        )

    def _install_exchange(self, model_parts, optimizers) -> str:
        """Gradient averaging, or LocalSGD / DiLoCo; -> what crosses the groups, for the log."""
        from torchtitan.fault_tolerance.gradients import average_gradients_across_replicas
        from torchtitan.fault_tolerance.semi_sync import start_semi_sync

        if not self.semi_sync:
            how = average_gradients_across_replicas(model_parts, self.manager)
            return f"gradients averaged across groups every step by {how}"
        (model,), (optimizer,) = model_parts, optimizers
        if self._probe is not None:  # before the synchronization's own hook
            optimizer.register_step_post_hook(lambda *_: self._record("inner"))
        self._semi_sync = start_semi_sync(self.cfg, self.manager, model, optimizer)
        return f"{self.cfg.semi_sync}: groups synchronize every {self.cfg.sync_every} steps"

    def begin_step(self, completed: int, data_iter):
        """Before the step after ``completed``: -> (the steps this group continues from, the
        data iterator to read it with). That is ``completed`` and ``data_iter``, unless the
        group just healed from a live one (its count, and the data read from its position) or
        its last step did not commit (one less: the step is run again, on the next batch)."""
        if not self.enabled:
            return completed, data_iter
        self._live.progress = completed
        if self.semi_sync:
            # A heal happens inside a synchronization, within the optimizer step of the step
            # the live group was in: that step is finished here too.
            adopted = self._live.take_adopted()
            continued = completed if adopted is None else adopted + 1
            self._note_live_replicas(self.manager.num_participants() or self.groups, continued)
        else:
            self.manager.start_quorum()
            self._live.take_adopted()
            continued = self.manager.current_step()
            self._note_live_replicas(self.manager.num_participants(), continued)
        if continued == completed:
            return completed, data_iter
        return continued, iter(self._live.dataloader)

    def replica_mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a per-group value (the loss, the MoE expert loads) over the live groups; a
        step's collective."""
        if not self.enabled or self.semi_sync:
            return value
        value = value.clone()
        average_across_replicas(self.manager, value)
        return value

    def should_commit(self, step: int) -> bool:
        """Whether ``step``'s update is applied (every rank calls it once per step, after the
        step's exchange across groups)."""
        if self.enabled:
            self.faults.at_point("commit", step)
        self.committed = not self.enabled or self.semi_sync or bool(self.manager.should_commit())
        return self.committed

    def step_metrics(self, step: int) -> dict[str, float]:
        """Per-step metrics: live groups, tokens trained by all of them, elements all-reduced
        across groups in the step."""
        if not self.enabled:
            return {}
        self._record("step", step)
        exchanged = self.manager.allreduce_elements - self._exchanged
        self._exchanged = self.manager.allreduce_elements
        trained = self._tokens_per_group * self.live_replicas if self.committed else 0
        return {
            "live_replicas": self.live_replicas,
            "tokens_trained": trained,
            "replica_allreduce_elements": exchanged,
        }

    def _note_live_replicas(self, live: int, completed: int) -> None:
        if live != self.live_replicas:
            logger.warning(
                "fault tolerance: %d of %d replica groups live from step %d (global batch %s)",
                live,
                self.groups,
                completed + 1,
                "full" if live == self.groups else f"{live}/{self.groups} of its size",
            )
        self.live_replicas = live

    def _record(self, point: str, step: int | None = None) -> None:
        if self._probe is not None:
            self._probe.record(self._live.progress + 1 if step is None else step, point)

    def close(self) -> None:
        if self._semi_sync is not None:
            self._semi_sync.__exit__(None, None, None)
        if self.manager is not None:
            self.manager.shutdown(wait=False)
