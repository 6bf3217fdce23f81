"""What the planner chooses (Layout) and what it takes as given (Workload), and how both map to
and from the trainer's config keys."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from torchtitan.config import JobConfig
from torchtitan.kernels.inplace_loss import in_place_chosen
from torchtitan.models import family_of, model_args_from_config
from torchtitan.models.llama3 import ModelArgs
from torchtitan.parallel.dims import DerivedDegrees
from torchtitan.planning.float8 import Float8Setting, converted_linears
from torchtitan.planning.shapes import Shapes, shapes


@dataclass(frozen=True)
class Layout(DerivedDegrees):
    """Parallel degrees, pipeline schedule, activation checkpointing and local batch of one job."""

    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    pp: int = 1
    local_batch_size: int = 1
    pp_schedule: str = "1F1B"
    pp_microbatch_size: int = 1
    pp_stages_per_rank: int = 0  # 0 = the schedule's default
    pp_split_points: tuple[int, ...] = ()
    pp_layers_per_stage: int = 0
    ac_mode: str = "none"  # none, full, selective
    ac_option: str = "op"  # with selective: "op" or N (every N-th block fully checkpointed)
    save_matmuls: str = "all"  # with selective op: all or alternate
    # Expert parallel: ranks of dp_shard x cp x tp (not extra ranks) that split each MoE layer's
    # experts; 1 for dense models.
    ep: int = 1

    @property
    def world_size(self) -> int:
        return self.dp_degree * self.model_parallel_size

    @property
    def microbatch_size(self) -> int:
        return self.pp_microbatch_size if self.pp > 1 else self.local_batch_size

    @property
    def n_microbatches(self) -> int:
        return self.local_batch_size // self.microbatch_size

    def describe(self) -> str:
        parts = []
        if self.pp > 1:
            parts.append(f"PP{self.pp}")
        if self.dp_replicate > 1:
            parts.append(
                f"HSDP{self.dp_replicate}x{self.dp_shard}"
                if self.dp_shard > 1
                else f"DDP{self.dp_replicate}"
            )
        elif self.dp_shard > 1:
            parts.append(f"FSDP{self.dp_shard}")
        for name in ("cp", "tp"):
            if getattr(self, name) > 1:
                parts.append(f"{name.upper()}{getattr(self, name)}")
        # EP takes its ranks from the others: after a comma, not a factor of the world size.
        return "x".join(parts) + (f",EP{self.ep}" if self.ep > 1 else "") or "1 GPU"

    def describe_ac(self) -> str:
        if self.ac_mode != "selective":
            return self.ac_mode
        if self.ac_option != "op":
            return f"every {self.ac_option}"
        return "sel" if self.save_matmuls == "all" else "sel-alt"

    def describe_pp(self) -> str:
        if self.pp == 1:
            return "-"
        return f"{self.pp_schedule} mb{self.pp_microbatch_size}x{self.n_microbatches}"

    def settings(self) -> dict[str, object]:
        """The config keys (section.key -> value) this layout sets; the pipeline and selective
        AC keys only where they matter (pp > 1, mode selective)."""
        keys = {
            "parallelism.data_parallel_replicate_degree": self.dp_replicate,
            "parallelism.data_parallel_shard_degree": self.dp_shard,
            "parallelism.context_parallel_degree": self.cp,
            "parallelism.tensor_parallel_degree": self.tp,
            "parallelism.pipeline_parallel_degree": self.pp,
            "parallelism.expert_parallel_degree": self.ep,
            "activation_checkpoint.mode": self.ac_mode,
            "training.local_batch_size": self.local_batch_size,
        }
        if self.pp > 1:
            keys.update(
                {
                    "parallelism.pipeline_parallel_schedule": self.pp_schedule,
                    "parallelism.pipeline_parallel_microbatch_size": self.pp_microbatch_size,
                    "parallelism.pipeline_parallel_stages_per_rank": self.pp_stages_per_rank,
                    "parallelism.pipeline_parallel_split_points": list(self.pp_split_points),
                    "parallelism.pipeline_parallel_layers_per_stage": self.pp_layers_per_stage,
                }
            )
        if self.ac_mode == "selective":
            keys["activation_checkpoint.selective_ac_option"] = self.ac_option
            keys["activation_checkpoint.save_matmuls"] = self.save_matmuls
        return keys

    def apply_to(self, cfg: JobConfig) -> JobConfig:
        """A copy of ``cfg`` that runs this layout (sections copied, ``cfg`` untouched)."""
        changes: dict[str, dict] = {}
        for key, value in self.settings().items():
            section, name = key.split(".")
            changes.setdefault(section, {})[name] = value
        sections = {s: dataclasses.replace(getattr(cfg, s), **kw) for s, kw in changes.items()}
        return dataclasses.replace(cfg, **sections)

    @classmethod
    def from_config(cls, cfg: JobConfig, world_size: int) -> Layout:
        """The layout a config runs (data_parallel_shard_degree -1 resolved against the world)."""
        p, ac = cfg.parallelism, cfg.activation_checkpoint
        others = (
            p.pipeline_parallel_degree
            * p.data_parallel_replicate_degree
            * p.context_parallel_degree
            * p.tensor_parallel_degree
        )
        dp_shard = p.data_parallel_shard_degree
        if dp_shard == -1:
            dp_shard = max(1, world_size // max(1, others))
        return cls(
            dp_replicate=p.data_parallel_replicate_degree,
            dp_shard=dp_shard,
            cp=p.context_parallel_degree,
            tp=p.tensor_parallel_degree,
            pp=p.pipeline_parallel_degree,
            local_batch_size=cfg.training.local_batch_size,
            pp_schedule=p.pipeline_parallel_schedule,
            pp_microbatch_size=p.pipeline_parallel_microbatch_size,
            pp_stages_per_rank=p.pipeline_parallel_stages_per_rank,
            pp_split_points=tuple(p.pipeline_parallel_split_points),
            pp_layers_per_stage=p.pipeline_parallel_layers_per_stage,
            ac_mode=ac.mode,
            ac_option=ac.selective_ac_option,
            save_matmuls=ac.save_matmuls,
            ep=p.expert_parallel_degree,
        )


@dataclass(frozen=True)
class Workload:
    """What is trained, whatever the layout: model shapes, sequence, batch and precision."""

    model: ModelArgs
    seq_len: int
    global_batch_size: int = -1  # samples per optimizer step; -1 = local batch x DP (not fixed)
    bf16: bool = True  # mixed_precision_param: bf16 compute with fp32 master weights
    reduce_fp32: bool = True  # FSDP reduce-scatters gradients in fp32
    compile: bool = True  # regional torch.compile of the blocks
    compile_loss: bool = False  # with compile: the loss is compiled too
    loss_parallel: bool = True  # with TP: the loss works on vocab-sharded logits
    reshard_policy: str = "default"  # parallelism.fsdp_reshard_after_forward
    logits_loss: str = "auto"  # training.logits_loss (the planner assumes CUDA)
    float8: Float8Setting | None = None  # [float8] with enable; None: bf16 linears
    sharded_embedding: bool = False  # experimental.fsdp_sharded_embedding
    copy_engine_all_gather: bool = False  # experimental.fsdp_copy_engine_all_gather

    @classmethod
    def from_config(cls, cfg: JobConfig, compile: bool | None = None) -> Workload:
        """The config's workload; the model's shape as the trainer builds it (flavor + the
        ``[model]`` overrides, MoE layers included); a bad shape raises ConfigError."""
        t, p, x = cfg.training, cfg.parallelism, cfg.experimental
        model = model_args_from_config(cfg.model, cfg.training.seq_len)
        return cls(
            model=model,
            seq_len=t.seq_len,
            global_batch_size=t.global_batch_size,
            bf16=t.mixed_precision_param == "bfloat16",
            reduce_fp32=t.mixed_precision_reduce == "float32",
            compile=cfg.compile.enable if compile is None else compile,
            compile_loss=cfg.compile.loss,
            loss_parallel=not p.disable_loss_parallel,
            reshard_policy=p.fsdp_reshard_after_forward,
            logits_loss=t.logits_loss,
            float8=Float8Setting.from_config(cfg.float8, family_of(cfg.model.name).float8_exclude),
            sharded_embedding=x.fsdp_sharded_embedding,
            copy_engine_all_gather=x.fsdp_copy_engine_all_gather,
        )

    def loss_kind(self, layout: Layout) -> str:
        """How the loss reads whole logits under ``layout``: in_place, compiled_loss_parallel
        (the compiled standard loss of vocabulary-sharded DTensor logits), compiled or eager."""
        if in_place_chosen(self.logits_loss, cuda=True):
            return "in_place"
        if not (self.compile and self.compile_loss):
            return "eager"
        return "compiled_loss_parallel" if layout.tp > 1 and self.loss_parallel else "compiled"

    @functools.cached_property
    def shape(self) -> Shapes:
        return shapes(self.model)

    @functools.cached_property
    def float8_linears(self) -> frozenset[str]:
        """The linears that run in float8 (wq ... w3 of every block, "output" for the head)."""
        return converted_linears(self.float8, self.shape)

    def float8_gathered(self, layout: Layout) -> frozenset[str]:
        """The float8 linears whose weights FSDP all-gathers in float8 under ``layout``."""
        if self.float8 is None or not self.float8.gathers_float8(layout.fsdp_degree):
            return frozenset()
        return self.float8_linears

    def microbatch_tokens(self, layout: Layout) -> float:
        """Tokens one GPU processes per microbatch (its CP share of the sequence)."""
        return layout.microbatch_size * self.seq_len / layout.cp

    def embedding_rows_sharded(self, layout: Layout) -> bool:
        """Whether the trainer looks the embedding up where its rows live under ``layout`` (no
        all-gather of the table, no reduce-scatter of its gradient): the switch, without TP,
        with FSDP sharding over more than one rank (torchtitan/parallel/fsdp.py)."""
        return self.sharded_embedding and layout.tp == 1 and layout.fsdp_degree > 1

    def gathers_on_copy_engines(self, layout: Layout, gpus_per_node: int) -> bool:
        """Whether FSDP all-gathers the blocks on the copy engines under ``layout``: the switch,
        with FSDP sharding over more than one rank, no pipeline, and a shard group within one
        node (the trainer refuses the switch otherwise)."""
        span = (layout.fsdp_degree - 1) * layout.tp + 1  # the shard group's ranks are tp apart
        return (
            self.copy_engine_all_gather
            and 1 < layout.fsdp_degree
            and layout.pp == 1
            and span <= gpus_per_node
        )

    def with_(self, **changes) -> Workload:
        return dataclasses.replace(self, **changes)

    def global_samples(self, layout: Layout) -> int:
        """Samples per optimizer step under ``layout``."""
        if self.global_batch_size > 0:
            return self.global_batch_size
        return layout.local_batch_size * layout.dp_degree

    def accum_steps(self, layout: Layout) -> int:
        return max(
            1, math.ceil(self.global_samples(layout) / (layout.local_batch_size * layout.dp_degree))
        )
