"""The sections of the job config: one dataclass per ``[section]`` of the TOML file, each field
an option with its one-line help (``--help`` prints them) and each section checking itself."""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.config.base import (
    ASSETS,
    AsyncMode,
    AttentionKernel,
    AttentionMaskKind,
    DecayType,
    ExcludableState,
    ExportDtype,
    LogitsLoss,
    MixedPrecisionDtype,
    ModelName,
    NonFinitePolicy,
    OptimizerImplementation,
    OptimizerName,
    Section,
    _check,
    opt,
)


@dataclass
class Job(Section):
    config_file: str = opt("", "TOML file with the job's options (CLI overrides win)")
    dump_folder: str = opt("./outputs", "folder for logs, TensorBoard, configs and checkpoints")
    description: str = opt("", "free-text description, logged at start")
    skip_memory_check: bool = opt(
        False, "launch even if preflight estimates more memory per GPU than the GPU has"
    )


@dataclass
class Model(Section):
    name: ModelName = opt("llama3", "model family")
    flavor: str = opt(
        "debugmodel",
        "model size; llama3: debugmodel, 1B, 3B, 8B, 70B, 405B; qwen3: debugmodel, "
        "debugmodel_moe, 0.6B ... 32B, 30B-A3B, 235B-A22B; deepseek_v3: debugmodel, 16B, "
        "16B-4L, 236B, 671B",
    )
    tokenizer_path: str = opt(
        str(ASSETS / "tokenizer.model"),
        "Llama 3 format tokenizer.model, or a Hugging Face tokenizer.json (pip install tokenizers)",
    )
    # Shape overrides of the flavor; 0 keeps the flavor's value.
    vocab_size: int = opt(0, "embedding/head rows, >= the tokenizer's size; 0 = the flavor's")
    dim: int = opt(0, "hidden size; 0 = the flavor's")
    n_layers: int = opt(0, "transformer blocks; 0 = the flavor's")
    n_heads: int = opt(0, "attention heads (must divide dim); 0 = the flavor's")
    n_kv_heads: int = opt(0, "key/value heads (must divide n_heads); 0 = the flavor's")
    ffn_dim_multiplier: float = opt(0.0, "SwiGLU hidden size multiplier; 0 = the flavor's")
    rope_theta: float = opt(0.0, "RoPE base frequency; 0 = the flavor's")
    attention: AttentionKernel = opt(
        "sdpa",
        "attention kernel: sdpa (any device), flex (FlexAttention, CUDA: skips masked blocks), "
        "varlen (varlen flash attention, CUDA bf16)",
    )
    mask: AttentionMaskKind = opt(
        "causal",
        "causal: a token sees every earlier token of its sample; document: only those of its "
        "own document (packed samples hold several)",
    )
    reset_positions: bool = opt(
        False,
        "RoPE positions restart at 0 at each document start (with document masking RoPE is "
        "relative, so this changes only rounding)",
    )
    # Mixture-of-Experts routing (MoE flavors only).
    moe_top_k: int = opt(0, "MoE: experts per token; 0 = the flavor's")
    moe_balance_bias: bool = opt(
        True, "MoE: balance expert loads by a per-expert selection bias (no auxiliary loss)"
    )
    moe_bias_update_rate: float = opt(1e-3, "MoE: how far each step moves the selection bias")
    moe_aux_loss_coeff: float = opt(0.0, "MoE: sequence-level auxiliary balance loss; 0 = off")

    def shape_overrides(self) -> dict[str, int | float]:
        """The ModelArgs fields this section replaces (those not left at 0)."""
        return {name: getattr(self, name) for name in MODEL_SHAPE_KEYS if getattr(self, name)}

    def moe_overrides(self) -> dict[str, int | float | bool]:
        """The MoE routing fields (``MoEArgs`` names) this section changes from the defaults."""
        default = Model()
        return {
            field: getattr(self, option)
            for option, field in MOE_OPTIONS.items()
            if getattr(self, option) != getattr(default, option)
        }

    def validate(self) -> None:
        super().validate()
        for name in MODEL_SHAPE_KEYS:
            value = getattr(self, name)
            _check(value >= 0, f"--model.{name} must be positive (0 = the flavor's); got {value}")
        for name in ("moe_top_k", "moe_bias_update_rate", "moe_aux_loss_coeff"):
            value = getattr(self, name)
            _check(value >= 0, f"--model.{name} must be >= 0; got {value}")


MOE_OPTIONS = {  # [model] option -> MoEArgs field
    "moe_top_k": "top_k",
    "moe_balance_bias": "balance_bias",
    "moe_bias_update_rate": "bias_update_rate",
    "moe_aux_loss_coeff": "aux_loss_coeff",
}

MODEL_SHAPE_KEYS = (
    "vocab_size",
    "dim",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "ffn_dim_multiplier",
    "rope_theta",
)


@dataclass
class Optimizer(Section):
    name: OptimizerName = opt("AdamW", "optimizer algorithm")
    lr: float = opt(8e-4, "peak learning rate")
    beta1: float = opt(0.9, "Adam beta1")
    beta2: float = opt(0.95, "Adam beta2")
    eps: float = opt(1e-8, "Adam epsilon")
    weight_decay: float = opt(0.1, "decoupled weight decay (AdamW) or L2 penalty (Adam)")
    implementation: OptimizerImplementation = opt(
        "auto",
        "kernel: fused, foreach, for-loop; auto = fused on CUDA, foreach on CPU",
    )

    def validate(self) -> None:
        super().validate()
        _check(self.lr >= 0, f"--optimizer.lr must be >= 0; got {self.lr}")


@dataclass
class LRScheduler(Section):
    warmup_steps: int = opt(200, "linear warmup steps from lr/warmup_steps to lr")
    decay_type: DecayType = opt("linear", "decay after warmup until training.steps")
    min_lr_ratio: float = opt(0.0, "final lr as a fraction of the peak lr")

    def validate(self) -> None:
        super().validate()
        _check(
            self.warmup_steps >= 0,
            f"--lr_scheduler.warmup_steps must be >= 0; got {self.warmup_steps}",
        )
        _check(
            0 <= self.min_lr_ratio <= 1,
            f"--lr_scheduler.min_lr_ratio must be in [0, 1]; got {self.min_lr_ratio}",
        )


@dataclass
class Training(Section):
    dataset: str = opt("sample", "sample (bundled), c4, hf:ID[:CONFIG], or a local file/folder")
    text_field: str = opt("text", "column holding the document text")
    data_workers: int = opt(
        -1, "processes that tokenize ahead of training: -1 = auto (1 on CUDA, 0 on CPU), 0, 1"
    )
    seq_len: int = opt(2048, "tokens per sample")
    join_documents: int = opt(
        1,
        "consecutive source documents packed as one document (for document masking: how "
        "long a document is); 1 = each its own",
    )
    local_batch_size: int = opt(8, "samples per device per micro-step")
    global_batch_size: int = opt(-1, "samples per optimizer step; -1 = local_batch_size x DP")
    steps: int = opt(10000, "optimizer steps to train")
    max_norm: float = opt(1.0, "gradient-norm clipping threshold; <= 0 disables clipping")
    mixed_precision_param: MixedPrecisionDtype = opt("bfloat16", "compute dtype on GPU")
    mixed_precision_reduce: MixedPrecisionDtype = opt("float32", "gradient reduction dtype")
    seed: int = opt(0, "random seed for weights and anything else random")
    deterministic: bool = opt(False, "use deterministic algorithms (slower)")
    gc_freq: int = opt(50, "run Python's garbage collector every N steps (it is off otherwise)")
    on_nonfinite: NonFinitePolicy = opt(
        "stop", "on a NaN/Inf loss or grad norm: stop (one-line error) or skip the step"
    )
    logits_loss: LogitsLoss = opt(
        "auto",
        "the loss of whole logits: in_place = kernels that write the gradient over the logits "
        "(one logits-sized tensor at the peak instead of two); standard = F.cross_entropy "
        "(compiled with --compile.loss); auto = in_place on CUDA",
    )

    def validate(self) -> None:
        super().validate()
        for key in ("seq_len", "join_documents", "local_batch_size", "steps", "gc_freq"):
            value = getattr(self, key)
            _check(value > 0, f"--training.{key} must be positive; got {value}")
        _check(
            self.global_batch_size == -1 or self.global_batch_size > 0,
            f"--training.global_batch_size must be positive or -1; got {self.global_batch_size}",
        )


@dataclass
class Validation(Section):
    enable: bool = opt(False, "compute the loss on held-out data every freq steps")
    dataset: str = opt(
        "",
        "validation data, forms as training.dataset; empty = the training dataset's "
        "validation split (DATASET@validation)",
    )
    freq: int = opt(500, "validate every N steps and at the last step")
    steps: int = opt(-1, "batches per validation; -1 = the whole validation set once")
    local_batch_size: int = opt(-1, "samples per device per batch; -1 = training.local_batch_size")

    def validate(self) -> None:
        super().validate()
        _check(self.freq > 0, f"--validation.freq must be positive; got {self.freq}")
        _check(
            self.steps == -1 or self.steps > 0,
            f"--validation.steps must be positive or -1 (the whole set); got {self.steps}",
        )
        _check(
            self.local_batch_size == -1 or self.local_batch_size > 0,
            "--validation.local_batch_size must be positive or -1 (training's); got "
            f"{self.local_batch_size}",
        )


@dataclass
class Checkpoint(Section):
    enable: bool = opt(False, "save checkpoints to folder and resume from the latest one")
    folder: str = opt("checkpoint", "checkpoint folder, relative to job.dump_folder")
    interval: int = opt(500, "with enable: save every N steps (and at the last step)")
    async_mode: AsyncMode = opt(
        "disabled", "async writes in the background; async_with_pinned_mem also needs CUDA"
    )
    keep_latest_k: int = opt(
        0, "keep the K newest step folders, delete older (0 = keep all; preflight checks the disk)"
    )
    load_step: int = opt(
        -1,
        "step to resume from; -1 = the latest complete one (later complete steps are set aside "
        "as stale at the first save)",
    )
    exclude_from_loading: list[ExcludableState] = opt([], "states not restored on resume")
    last_save_model_only: bool = opt(False, "at the last step save only the model weights")
    export_dtype: ExportDtype = opt("float32", "dtype of last_save_model_only weights")
    create_seed_checkpoint: bool = opt(
        False, "write the initial weights to folder/step-0 from one process, then exit"
    )
    initial_load_path: str = opt("", "DCP checkpoint whose model weights the run starts from")
    initial_load_in_hf: bool = opt(
        False, "initial_load_path is a Hugging Face Llama folder (safetensors + config.json)"
    )
    initial_load_model_only: bool = opt(
        True, "load only the model weights from initial_load_path (else every state)"
    )

    def validate(self) -> None:
        super().validate()
        _check(self.interval > 0, f"--checkpoint.interval must be positive; got {self.interval}")
        _check(
            self.keep_latest_k >= 0,
            f"--checkpoint.keep_latest_k must be >= 0 (0 = keep all); got {self.keep_latest_k}",
        )
        _check(
            self.load_step >= -1,
            f"--checkpoint.load_step must be a step >= 0 or -1 (latest); got {self.load_step}",
        )
        _check(
            self.load_step == -1 or self.enable,
            "--checkpoint.load_step needs --checkpoint.enable",
        )


@dataclass
class Metrics(Section):
    log_freq: int = opt(10, "log metrics every N steps")
    enable_tensorboard: bool = opt(True, "write TensorBoard events under dump_folder/tb")

    def validate(self) -> None:
        super().validate()
        _check(self.log_freq > 0, f"--metrics.log_freq must be positive; got {self.log_freq}")


@dataclass
class Profiling(Section):
    enable_profiling: bool = opt(False, "write torch.profiler traces every profile_freq steps")
    save_traces_folder: str = opt(
        "profile_traces", "profiler traces folder (iteration_N/rankR_trace.json), under dump_folder"
    )
    profile_freq: int = opt(100, "profile one window every N steps")
    profiler_warmup: int = opt(3, "steps the profiler warms up before each recorded window")
    profiler_active: int = opt(1, "steps recorded per window")
    enable_memory_snapshot: bool = opt(
        False, "record CUDA allocator history; dump a snapshot every profile_freq steps and on OOM"
    )
    save_memory_snapshot_folder: str = opt(
        "memory_snapshot", "memory snapshots folder (iteration_N/rankR_memory_snapshot.pickle)"
    )

    def validate(self) -> None:
        super().validate()
        if not (self.enable_profiling or self.enable_memory_snapshot):
            return
        _check(
            self.profile_freq > 0,
            f"--profiling.profile_freq must be positive; got {self.profile_freq}",
        )
        if not self.enable_profiling:
            return
        _check(
            self.profiler_active > 0 and self.profiler_warmup >= 0,
            "--profiling.profiler_active must be >= 1 and --profiling.profiler_warmup >= 0; got "
            f"{self.profiler_active} and {self.profiler_warmup}",
        )
        _check(
            self.profiler_warmup + self.profiler_active <= self.profile_freq,
            f"--profiling.profiler_warmup + profiler_active ({self.profiler_warmup} + "
            f"{self.profiler_active}) must fit in --profiling.profile_freq ({self.profile_freq})",
        )


@dataclass
class Comm(Section):
    init_timeout_seconds: int = opt(
        300, "collective timeout in seconds until the first step is done (compile, warm-up)"
    )
    train_timeout_seconds: int = opt(
        100, "collective timeout in seconds after the first step; a hang ends after this long"
    )
    trace_buf_size: int = opt(
        20000, "Flight Recorder entries kept per rank (last N collectives); 0 disables it"
    )
    flight_recorder_folder: str = opt(
        "comm_traces", "Flight Recorder dumps (rank_R) on a timeout or failure, under dump_folder"
    )
    dump_wait_seconds: int = opt(
        15,
        "NCCL: how long a timed-out rank waits for a Flight Recorder dump; it then sleeps 4x this "
        "(so every rank can dump) before aborting",
    )

    def validate(self) -> None:
        super().validate()
        for key in ("init_timeout_seconds", "train_timeout_seconds", "dump_wait_seconds"):
            value = getattr(self, key)
            _check(value > 0, f"--comm.{key} must be positive; got {value}")
        _check(
            self.trace_buf_size >= 0,
            f"--comm.trace_buf_size must be >= 0 (0 disables); got {self.trace_buf_size}",
        )
