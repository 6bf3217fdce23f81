"""Typed job configuration: defaults < TOML file < command-line overrides.

Every option is a dataclass field with a one-line help text (``opt(default, help)``), which
``--help`` prints. A field with a fixed set of values is typed with one of the ``Literal``
aliases below: that alias is the only list of its values (other modules import it, see
``choices``), and the value is checked as soon as it is read. ``parse_args`` reads
``--job.config_file`` first, then applies the TOML file, then the CLI overrides, then runs
``JobConfig.validate()`` (each section checks itself); every user mistake raises ``ConfigError``
with one line. This module imports no other project module but ``paths``.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from torchtitan.paths import shown

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ASSETS = Path(__file__).resolve().parent / "assets"

# --------------------------------------------------------------------------- allowed values

ModelName = Literal["llama3"]
OptimizerName = Literal["AdamW", "Adam"]
OptimizerImplementation = Literal["auto", "fused", "foreach", "for-loop"]
DecayType = Literal["linear", "cosine", "none"]
MixedPrecisionDtype = Literal["bfloat16", "float32"]
NonFinitePolicy = Literal["stop", "skip"]
RotateMethod = Literal["allgather", "alltoall"]
PipelineSchedule = Literal[
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
    "CSV",
]
ReshardAfterForward = Literal["default", "always", "never"]
AsyncMode = Literal["disabled", "async", "async_with_pinned_mem"]
ExcludableState = Literal["optimizer", "lr_scheduler", "dataloader", "train_state"]
ExportDtype = Literal["float32", "bfloat16", "float16"]
ACMode = Literal["none", "full", "selective"]
SaveMatmuls = Literal["all", "alternate"]


def choices(alias) -> tuple[str, ...]:
    """The allowed values of a ``Literal`` alias, in declaration order."""
    if typing.get_origin(alias) is not Literal:
        raise TypeError(f"choices() expects a Literal alias; got {alias!r}")
    return typing.get_args(alias)


def suggest(name: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the candidate closest to ``name`` (ignoring case), or ``""``.

    The one "did you mean" of the project: config keys and values, model flavors and fields.
    """
    by_folded = {c.lower(): c for c in candidates}
    close = difflib.get_close_matches(str(name).lower(), list(by_folded), n=1, cutoff=0.5)
    return f"; did you mean '{by_folded[close[0]]}'?" if close else ""


class ConfigError(ValueError):
    """A user mistake in the configuration; the message is one actionable line."""


def opt(default, help: str):
    """A config field with its one-line help text."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _not_one_of(key: str, value, allowed: tuple[str, ...]) -> ConfigError:
    return ConfigError(
        f"--{key} must be one of {', '.join(allowed)}; got {value!r}{suggest(str(value), allowed)}"
    )


def _literal_values(tp) -> tuple[str, ...] | None:
    """The allowed values of a ``Literal`` or ``list[Literal]`` field type, else None."""
    if typing.get_origin(tp) is list:
        (tp,) = typing.get_args(tp)
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else None


class Section:
    """Base of the config sections: ``validate()`` checks every ``Literal`` field's value (also
    one set in Python, which no parser saw); sections with more checks extend it."""

    def validate(self) -> None:
        section = _section_name(type(self))
        for name, tp in typing.get_type_hints(type(self)).items():
            allowed = _literal_values(tp)
            if allowed is None:
                continue
            value = getattr(self, name)
            for item in value if isinstance(value, list) else [value]:
                if item not in allowed:
                    raise _not_one_of(f"{section}.{name}", item, allowed)


# --------------------------------------------------------------------------- sections


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
    flavor: str = opt("debugmodel", "model size: debugmodel, 1B, 3B, 8B, 70B, 405B")
    tokenizer_path: str = opt(str(ASSETS / "tokenizer.model"), "Llama 3 format tokenizer.model")
    # Shape overrides of the flavor; 0 keeps the flavor's value.
    vocab_size: int = opt(0, "embedding/head rows, >= the tokenizer's size; 0 = the flavor's")
    dim: int = opt(0, "hidden size; 0 = the flavor's")
    n_layers: int = opt(0, "transformer blocks; 0 = the flavor's")
    n_heads: int = opt(0, "attention heads (must divide dim); 0 = the flavor's")
    n_kv_heads: int = opt(0, "key/value heads (must divide n_heads); 0 = the flavor's")
    ffn_dim_multiplier: float = opt(0.0, "SwiGLU hidden size multiplier; 0 = the flavor's")
    rope_theta: float = opt(0.0, "RoPE base frequency; 0 = the flavor's")

    def shape_overrides(self) -> dict[str, int | float]:
        """The ModelArgs fields this section replaces (those not left at 0)."""
        return {name: getattr(self, name) for name in MODEL_SHAPE_KEYS if getattr(self, name)}

    def validate(self) -> None:
        super().validate()
        for name in MODEL_SHAPE_KEYS:
            value = getattr(self, name)
            _check(value >= 0, f"--model.{name} must be positive (0 = the flavor's); got {value}")


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
        "auto", "kernel; auto = fused on CUDA, foreach on CPU"
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
    loss_chunk_tokens: int = opt(
        0,
        "fuse the output head with the loss, computed this many tokens at a time, so the whole "
        "logits tensor never exists; 0 = off (not with tensor parallel)",
    )

    def validate(self) -> None:
        super().validate()
        _check(
            self.loss_chunk_tokens >= 0,
            f"--training.loss_chunk_tokens must be >= 0 (0 = off); got {self.loss_chunk_tokens}",
        )
        for key in ("seq_len", "local_batch_size", "steps", "gc_freq"):
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
class Parallelism(Section):
    data_parallel_replicate_degree: int = opt(1, "replicas of the model (DDP / HSDP outer dim)")
    data_parallel_shard_degree: int = opt(-1, "FSDP shard degree; -1 = whatever is left")
    tensor_parallel_degree: int = opt(1, "tensor + sequence parallel degree")
    context_parallel_degree: int = opt(1, "context parallel degree")
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
class Checkpoint(Section):
    enable: bool = opt(False, "save checkpoints to folder and resume from the latest one")
    folder: str = opt("checkpoint", "checkpoint folder, relative to job.dump_folder")
    interval: int = opt(500, "with enable: save every N steps (and at the last step)")
    async_mode: AsyncMode = opt(
        "disabled", "async writes in the background; async_with_pinned_mem also needs CUDA"
    )
    keep_latest_k: int = opt(0, "keep the K newest step folders, delete older (0 = keep all)")
    load_step: int = opt(-1, "step to resume from; -1 = the latest complete one")
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


Float8Recipe = Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"]


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
        ["output"], "linears whose FQN contains one of these stay in high precision"
    )
    skip_small: bool = opt(
        True, "keep linears too small to gain from float8 in high precision (H100 thresholds)"
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


@dataclass
class JobConfig:
    job: Job = field(default_factory=Job)
    model: Model = field(default_factory=Model)
    optimizer: Optimizer = field(default_factory=Optimizer)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)
    training: Training = field(default_factory=Training)
    validation: Validation = field(default_factory=Validation)
    parallelism: Parallelism = field(default_factory=Parallelism)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    activation_checkpoint: ActivationCheckpoint = field(default_factory=ActivationCheckpoint)
    compile: Compile = field(default_factory=Compile)
    float8: Float8 = field(default_factory=Float8)
    metrics: Metrics = field(default_factory=Metrics)
    profiling: Profiling = field(default_factory=Profiling)
    comm: Comm = field(default_factory=Comm)

    def validate(self) -> None:
        """Checks that need nothing but the config itself (no files, no devices): each
        section's, then those across sections."""
        for section in dataclasses.fields(self):
            getattr(self, section.name).validate()
        _check(
            self.training.loss_chunk_tokens == 0 or self.parallelism.tensor_parallel_degree == 1,
            "--training.loss_chunk_tokens does not combine with tensor parallelism (loss parallel "
            "already splits the logits over the TP ranks); set it to 0",
        )

    def to_toml(self) -> str:
        lines = []
        for section in dataclasses.fields(self):
            lines.append(f"[{section.name}]")
            for f in dataclasses.fields(getattr(self, section.name)):
                lines.append(
                    f"{f.name} = {_toml_value(getattr(getattr(self, section.name), f.name))}"
                )
            lines.append("")
        return "\n".join(lines)


# --------------------------------------------------------------------------- types and coercion

_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


class _NoValue:
    """A CLI flag given without a value (``--compile.enable``): only a bool may be bare."""


def _field_types(section_cls) -> dict[str, type]:
    return typing.get_type_hints(section_cls)


def _sections() -> dict[str, type]:
    return {f.name: typing.get_type_hints(JobConfig)[f.name] for f in dataclasses.fields(JobConfig)}


def _section_name(section_cls) -> str:
    return next(name for name, cls in _sections().items() if cls is section_cls)


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def _coerce(key: str, value, tp):
    """Convert a CLI string or TOML value to the field's type, or fail naming the key."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "")):
            return None
        return _coerce(key, value, args[0])
    if origin is Literal:
        if isinstance(value, str) and value in typing.get_args(tp):
            return value
        raise _not_one_of(key, value, typing.get_args(tp))
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list):
            raise ConfigError(f"--{key} expects a comma-separated list, got {value!r}")
        return [
            _coerce(key, v.strip() if isinstance(v, str) else v, item_tp) for v in items if v != ""
        ]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.lower()]
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"--{key} expects {_type_name(tp)}, got {value!r}")


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if value is None:
        return '""'
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


# --------------------------------------------------------------------------- key lookup

_CLI = "command line"


def _all_keys() -> list[str]:
    return [f"{s}.{k}" for s, cls in _sections().items() for k in _field_types(cls)]


def _unknown_key(key: str, where: str) -> ConfigError:
    hint = suggest(key, _all_keys()) or "; see --help for the valid keys"
    return ConfigError(f"unknown config key '{key}' ({where}){hint}")


def _set(cfg: JobConfig, key: str, value, where: str) -> None:
    """Set one option; ``where`` is "command line" or the TOML file the value came from."""
    section_name, _, name = key.partition(".")
    sections = _sections()
    if section_name not in sections or name not in _field_types(sections[section_name]):
        raise _unknown_key(key, where)
    tp = _field_types(sections[section_name])[name]
    if isinstance(value, _NoValue):
        if tp is not bool:
            raise ConfigError(f"--{key} needs a value")
        value = True
    try:
        coerced = _coerce(key, value, tp)
    except ConfigError as e:
        if where == _CLI:
            raise
        raise ConfigError(f"{e} (in {where})") from None
    setattr(getattr(cfg, section_name), name, coerced)


# --------------------------------------------------------------------------- sources


def _split_cli(argv: list[str]) -> list[tuple[str, object]]:
    """['--a.b', '1', '--c.d=2', '--flag'] -> [('a.b', '1'), ('c.d', '2'), ('flag', _NoValue())]."""
    pairs, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}; options look like --section.key value")
        arg = arg[2:]
        if "=" in arg:
            key, value = arg.split("=", 1)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            key, value = arg, argv[i + 1]
            i += 1
        else:
            key, value = arg, _NoValue()  # bare flag: only valid for bools, checked in _set
        pairs.append((key, value))
        i += 1
    return pairs


def _read_toml(path: str) -> dict:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"config file not found: {shown(path)}{_bundled_hint(path)}")
    try:
        with open(p, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None


def _bundled_hint(path: str) -> str:
    """A relative path is relative to the current directory; name a bundled file of that name."""
    bundled = Path(__file__).resolve().parents[1] / path
    if Path(path).is_absolute() or not bundled.is_file():
        return ""
    return f"; the bundled one is {bundled}"


def _apply_toml(cfg: JobConfig, data: dict, path: str) -> list[str]:
    """Set the options of a parsed TOML file; returns the keys it set."""
    keys = []
    for section_name, section in data.items():
        if not isinstance(section, dict):
            raise _unknown_key(section_name, f"top-level key in {path}; options live in [sections]")
        for name, value in section.items():
            _set(cfg, f"{section_name}.{name}", value, path)
            keys.append(f"{section_name}.{name}")
    return keys


def _field_help(f: dataclasses.Field, tp) -> str:
    allowed = _literal_values(tp)
    if allowed is None:
        return f.metadata["help"]
    quantifier = "any" if typing.get_origin(tp) is list else "one"
    return f"{f.metadata['help']} ({quantifier} of: {', '.join(allowed)})"


def _option_line(key: str, default, current, source: str | None) -> str:
    """``--key (default)``, or ``--key VALUE (default D, from SOURCE)`` where a value is set."""
    if source is None or current == default:
        return f"  --{key} ({_toml_value(default)})"
    return f"  --{key} {_toml_value(current)} (default {_toml_value(default)}, from {source})"


def help_text(cfg: JobConfig | None = None, sources: dict[str, str] | None = None) -> str:
    """Every option with its default and doc; with ``cfg``, the value it has where ``sources``
    (key -> the TOML file or the command line) set one."""
    lines = ["usage: python -m torchtitan.train [--section.key VALUE ...]", ""]
    sources = sources or {}
    for section_name, cls in _sections().items():
        lines.append(f"[{section_name}]")
        defaults, types_ = cls(), _field_types(cls)
        current = getattr(cfg, section_name) if cfg is not None else defaults
        for f in dataclasses.fields(cls):
            key = f"{section_name}.{f.name}"
            default, value = getattr(defaults, f.name), getattr(current, f.name)
            lines.append(_option_line(key, default, value, sources.get(key)))
            lines.append(f"      {_field_help(f, types_[f.name])}")
    return "\n".join(lines)


def _help_for(argv: list[str]) -> str:
    """``--help``: the options with the values the TOML file and the other arguments set."""
    try:
        cfg, sources = _build([a for a in argv if a not in ("-h", "--help")])
    except ConfigError as e:  # still help, with the defaults, and why the values are missing
        return f"{help_text()}\n\nnote: showing defaults only: {e}"
    return help_text(cfg, sources)


def _print_help(text: str) -> None:
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `--help | head` closed the pipe; exit quietly, like other tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _build(argv: list[str]) -> tuple[JobConfig, dict[str, str]]:
    """Defaults < TOML file < command line, unvalidated; -> (config, key -> where it was set)."""
    cli = _split_cli(argv)
    cfg, sources = JobConfig(), {}
    for key, value in cli:
        if key == "job.config_file":
            _set(cfg, key, value, _CLI)
    if cfg.job.config_file:
        path = cfg.job.config_file
        sources.update(dict.fromkeys(_apply_toml(cfg, _read_toml(path), path), path))
    for key, value in cli:
        _set(cfg, key, value, _CLI)
        sources[key] = _CLI
    return cfg, sources


def parse_args(argv: list[str] | None = None) -> JobConfig:
    """Build the config from defaults, the TOML file and CLI overrides, then validate it."""
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        _print_help(_help_for(argv))
        raise SystemExit(0)
    cfg, _ = _build(argv)
    cfg.validate()
    return cfg
