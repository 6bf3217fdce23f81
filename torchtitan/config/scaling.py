"""The sections that decide how a job scales and how fast it runs: the parallelism degrees,
activation checkpointing, compile, Float8 and the opt-in experimental tricks."""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.config.base import (
    ACMode,
    Float8Recipe,
    PipelineSchedule,
    ReshardAfterForward,
    RotateMethod,
    SaveMatmuls,
    Section,
    _check,
    opt,
)


@dataclass
class Parallelism(Section):
    data_parallel_replicate_degree: int = opt(1, "replicas of the model (DDP / HSDP outer dim)")
    data_parallel_shard_degree: int = opt(-1, "FSDP shard degree; -1 = whatever is left")
    tensor_parallel_degree: int = opt(1, "tensor + sequence parallel degree")
    context_parallel_degree: int = opt(1, "context parallel degree")
    expert_parallel_degree: int = opt(
        1, "MoE: ranks one layer's experts are split over, taken from dp_shard x cp x tp"
    )
    context_parallel_rotate_method: RotateMethod = opt(
        "allgather", "how ring attention exchanges K/V shards"
    )
    pipeline_parallel_degree: int = opt(1, "pipeline parallel degree")
    pipeline_parallel_schedule: PipelineSchedule = opt(
        "1F1B", "pipeline schedule; CSV reads pipeline_parallel_schedule_csv"
    )
    pipeline_parallel_schedule_csv: str = opt("", "with schedule CSV: the schedule file")
    pipeline_parallel_microbatch_size: int = opt(1, "samples per pipeline microbatch")
    pipeline_parallel_stages_per_rank: int = opt(
        0, "stages per rank for looped schedules; 0 = 2 (single-stage: 1, V-shaped: 2)"
    )
    pipeline_parallel_split_points: list[int] = opt(
        [], "layer indices where stages 2, 3, ... begin; empty = balanced split"
    )
    pipeline_parallel_layers_per_stage: int = opt(
        0, "layers per stage (sets the stage count); 0 = balanced split"
    )
    fsdp_reshard_after_forward: ReshardAfterForward = opt(
        "default", "free gathered weights after forward; default = yes, except under PP"
    )
    disable_loss_parallel: bool = opt(False, "with TP: gather the logits instead of loss parallel")
    enable_async_tensor_parallel: bool = opt(
        False, "overlap TP collectives with matmuls (CUDA + compile)"
    )


@dataclass
class ActivationCheckpoint(Section):
    mode: ACMode = opt("none", "which blocks recompute their activations in backward")
    selective_ac_option: str = opt("op", "with mode=selective: 'op' or N (every N-th block)")
    save_matmuls: SaveMatmuls = opt(
        "all",
        "selective op: keep every matmul output, or every other one per block (alternate: less "
        "memory, some recompute)",
    )

    def validate(self) -> None:
        super().validate()
        option = self.selective_ac_option
        _check(
            self.mode != "selective" or option == "op" or (option.isdigit() and int(option) > 0),
            "--activation_checkpoint.selective_ac_option must be 'op' or a positive integer N; "
            f"got {option!r}",
        )


@dataclass
class Compile(Section):
    enable: bool = opt(False, "torch.compile each transformer block")
    loss: bool = opt(False, "with enable: also compile the loss")
    reorder_collectives: bool = opt(
        True,
        "with enable: let inductor move the collectives inside compiled blocks (CP's K/V "
        "exchange, TP's) so computation hides them, within its peak-memory budget",
    )
    tune_kernels: bool = opt(
        False,
        "with enable: let inductor tune the block sizes of its generated GPU kernels "
        "(coordinate descent): +0.4-1.5% tokens/s measured; 30-110 s more compile with an "
        "empty inductor cache (TORCHINDUCTOR_CACHE_DIR), none with a warm one",
    )

    def validate(self) -> None:
        super().validate()
        _check(
            self.enable or not self.tune_kernels,
            "--compile.tune_kernels needs --compile.enable",
        )


@dataclass
class Float8(Section):
    enable: bool = opt(False, "train the linears in float8 through torchao (pip install .[float8])")
    recipe: Float8Recipe = opt(
        "tensorwise",
        "scaling: one scale per tensor (fastest), per row, or per row with grad_weight in bf16",
    )
    fsdp_float8_all_gather: bool = opt(
        False, "tensorwise + FSDP: all-gather the weights in float8 (half the bytes of bf16)"
    )
    precompute_scales: bool = opt(
        False, "with fsdp_float8_all_gather: one amax all-reduce per step for all weights"
    )
    filter_fqns: list[str] = opt(
        [],
        "linears whose FQN contains one of these stay in high precision, besides those the "
        "model keeps (Llama: the output head)",
    )
    emulate: bool = opt(
        False, "float8 numerics with high-precision matmuls: CPU, older GPUs, tests (slow)"
    )

    def validate(self) -> None:
        super().validate()
        _check(
            not self.fsdp_float8_all_gather or self.recipe == "tensorwise",
            "--float8.fsdp_float8_all_gather needs --float8.recipe tensorwise (per-row scales "
            f"cannot be all-gathered); got {self.recipe}",
        )
        _check(
            not self.precompute_scales or self.fsdp_float8_all_gather,
            "--float8.precompute_scales needs --float8.fsdp_float8_all_gather",
        )


@dataclass
class Experimental(Section):
    """Opt-in performance tricks (torchtitan/experimental/), each off by default: each bought
    less than the 2 % tokens/s or 2 GiB a default must pay on a headline row (docs/performance.md
    says what each measured)."""

    float8_fused_swiglu: bool = opt(
        False,
        "Float8 tensorwise, no TP: each feed-forward's three linears as one function whose "
        "backward casts the SwiGLU's gradients in Triton kernels of ours",
    )
    fsdp_grad_copy_in_kernel: bool = opt(
        False,
        "CUDA: lay FSDP's gradients out for the reduce-scatter in a Triton kernel of ours "
        "(patches a private FSDP function, process-wide)",
    )
    fsdp_copy_engine_all_gather: bool = opt(
        False,
        "CUDA, FSDP/HSDP shard groups within one node, no PP: all-gather each block's weights "
        "on the copy engines through torch symmetric memory, leaving every SM to the matmuls",
    )
    fsdp_sharded_embedding: bool = opt(
        False,
        "FSDP/HSDP without TP: look the embedding up where its vocabulary rows live instead of "
        "all-gathering the table",
    )
    compiled_adamw: bool = opt(
        False, "CUDA: the Adam/AdamW update as one torch.compile'd kernel per parameter"
    )
