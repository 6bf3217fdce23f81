"""Typed job configuration: defaults < TOML file < command-line overrides.

Every option is a dataclass field with a one-line help text (``opt(default, help)``), which
``--help`` prints. ``parse_args`` reads ``--job.config_file`` first, then applies the TOML file,
then the CLI overrides, then validates; every user mistake raises ``ConfigError`` with one line.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ASSETS = Path(__file__).resolve().parent / "assets"


class ConfigError(ValueError):
    """A user mistake in the configuration; the message is one actionable line."""


def opt(default, help: str):
    """A config field with its one-line help text."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class Job:
    config_file: str = opt("", "TOML file with the job's options (CLI overrides win)")
    dump_folder: str = opt("./outputs", "folder for logs, TensorBoard, configs and checkpoints")
    description: str = opt("", "free-text description, logged at start")
    skip_memory_check: bool = opt(
        False, "launch even if preflight estimates more memory per GPU than the GPU has"
    )


@dataclass
class Model:
    name: str = opt("llama3", "model family")
    flavor: str = opt("debugmodel", "model size: debugmodel, 1B, 3B, 8B, 70B, 405B")
    tokenizer_path: str = opt(str(ASSETS / "tokenizer.model"), "Llama 3 format tokenizer.model")


@dataclass
class Optimizer:
    name: str = opt("AdamW", "AdamW or Adam")
    lr: float = opt(8e-4, "peak learning rate")
    beta1: float = opt(0.9, "Adam beta1")
    beta2: float = opt(0.95, "Adam beta2")
    eps: float = opt(1e-8, "Adam epsilon")
    weight_decay: float = opt(0.1, "decoupled weight decay (AdamW) or L2 penalty (Adam)")
    implementation: str = opt(
        "auto", "auto (fused on CUDA, foreach on CPU), fused, foreach, for-loop"
    )


@dataclass
class LRScheduler:
    warmup_steps: int = opt(200, "linear warmup steps from lr/warmup_steps to lr")
    decay_type: str = opt("linear", "decay after warmup until training.steps: linear, cosine, none")
    min_lr_ratio: float = opt(0.0, "final lr as a fraction of the peak lr")


@dataclass
class Training:
    dataset: str = opt("sample", "sample (bundled), c4, hf:ID[:CONFIG], or a local file/folder")
    text_field: str = opt("text", "column holding the document text")
    seq_len: int = opt(2048, "tokens per sample")
    local_batch_size: int = opt(8, "samples per device per micro-step")
    global_batch_size: int = opt(-1, "samples per optimizer step; -1 = local_batch_size x DP")
    steps: int = opt(10000, "optimizer steps to train")
    max_norm: float = opt(1.0, "gradient-norm clipping threshold; <= 0 disables clipping")
    mixed_precision_param: str = opt("bfloat16", "compute dtype on GPU: bfloat16 or float32")
    mixed_precision_reduce: str = opt("float32", "gradient reduction dtype: float32 or bfloat16")
    seed: int = opt(0, "random seed for weights and anything else random")
    deterministic: bool = opt(False, "use deterministic algorithms (slower)")
    gc_freq: int = opt(50, "run Python's garbage collector every N steps (it is off otherwise)")
    on_nonfinite: str = opt("stop", "on a NaN/Inf loss or grad norm: stop (one-line error) or skip")


@dataclass
class Parallelism:
    data_parallel_replicate_degree: int = opt(1, "replicas of the model (DDP / HSDP outer dim)")
    data_parallel_shard_degree: int = opt(-1, "FSDP shard degree; -1 = whatever is left")
    tensor_parallel_degree: int = opt(1, "tensor + sequence parallel degree")
    context_parallel_degree: int = opt(1, "context parallel degree")
    context_parallel_rotate_method: str = opt(
        "allgather", "how ring attention exchanges K/V shards: allgather or alltoall"
    )
    pipeline_parallel_degree: int = opt(1, "pipeline parallel degree")
    pipeline_parallel_schedule: str = opt(
        "1F1B",
        "GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, "
        "DualPipeV, or CSV (read pipeline_parallel_schedule_csv)",
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
    fsdp_reshard_after_forward: str = opt(
        "default",
        "free gathered weights after forward: default (yes, except under PP), always, never",
    )
    disable_loss_parallel: bool = opt(False, "with TP: gather the logits instead of loss parallel")
    enable_async_tensor_parallel: bool = opt(
        False, "overlap TP collectives with matmuls (CUDA + compile)"
    )


@dataclass
class Checkpoint:
    enable: bool = opt(False, "save checkpoints to folder and resume from the latest one")
    folder: str = opt("checkpoint", "checkpoint folder, relative to job.dump_folder")
    interval: int = opt(500, "with enable: save every N steps (and at the last step)")
    async_mode: str = opt(
        "disabled", "disabled, async (write in the background) or async_with_pinned_mem (CUDA)"
    )
    keep_latest_k: int = opt(0, "keep the K newest step folders, delete older (0 = keep all)")
    load_step: int = opt(-1, "step to resume from; -1 = the latest complete one")
    exclude_from_loading: list[str] = opt(
        [], "states not restored on resume: optimizer, lr_scheduler, dataloader, train_state"
    )
    last_save_model_only: bool = opt(False, "at the last step save only the model weights")
    export_dtype: str = opt(
        "float32", "dtype of last_save_model_only weights: float32, bfloat16, float16"
    )
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
        _check_choice(
            "checkpoint.async_mode", self.async_mode, ("disabled", "async", "async_with_pinned_mem")
        )
        _check_choice(
            "checkpoint.export_dtype", self.export_dtype, ("float32", "bfloat16", "float16")
        )
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
        excludable = ("optimizer", "lr_scheduler", "dataloader", "train_state")
        for name in self.exclude_from_loading:
            _check_choice("checkpoint.exclude_from_loading", name, excludable)


@dataclass
class ActivationCheckpoint:
    mode: str = opt("none", "none, full or selective")
    selective_ac_option: str = opt("op", "with mode=selective: 'op' or N (every N-th block)")
    save_matmuls: str = opt(
        "all",
        "selective op: keep 'all' matmul outputs, or every other one per block ('alternate': less "
        "memory, some recompute)",
    )


@dataclass
class Compile:
    enable: bool = opt(False, "torch.compile each transformer block")
    loss: bool = opt(False, "with enable: also compile the loss")


@dataclass
class Metrics:
    log_freq: int = opt(10, "log metrics every N steps")
    enable_tensorboard: bool = opt(True, "write TensorBoard events under dump_folder/tb")


@dataclass
class Profiling:
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
class Comm:
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
    parallelism: Parallelism = field(default_factory=Parallelism)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    activation_checkpoint: ActivationCheckpoint = field(default_factory=ActivationCheckpoint)
    compile: Compile = field(default_factory=Compile)
    metrics: Metrics = field(default_factory=Metrics)
    profiling: Profiling = field(default_factory=Profiling)
    comm: Comm = field(default_factory=Comm)

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


def _field_types(section_cls) -> dict[str, type]:
    return typing.get_type_hints(section_cls)


def _sections() -> dict[str, type]:
    return {f.name: typing.get_type_hints(JobConfig)[f.name] for f in dataclasses.fields(JobConfig)}


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


def _all_keys() -> list[str]:
    return [f"{s}.{k}" for s, cls in _sections().items() for k in _field_types(cls)]


def _unknown_key(key: str, where: str) -> ConfigError:
    close = difflib.get_close_matches(key, _all_keys(), n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else "; see --help for the valid keys"
    return ConfigError(f"unknown config key '{key}' ({where}){hint}")


def _set(cfg: JobConfig, key: str, value, where: str) -> None:
    section_name, _, name = key.partition(".")
    sections = _sections()
    if section_name not in sections or name not in _field_types(sections[section_name]):
        raise _unknown_key(key, where)
    tp = _field_types(sections[section_name])[name]
    setattr(getattr(cfg, section_name), name, _coerce(key, value, tp))


# --------------------------------------------------------------------------- sources


def _split_cli(argv: list[str]) -> list[tuple[str, object]]:
    """['--a.b', '1', '--c.d=2', '--flag'] -> [('a.b', '1'), ('c.d', '2'), ('flag', True)]."""
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
            key, value = arg, True  # bare flag: only valid for bools, checked in _coerce
        pairs.append((key, value))
        i += 1
    return pairs


def _read_toml(path: str) -> dict:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(p, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None


def _apply_toml(cfg: JobConfig, data: dict, path: str) -> None:
    for section_name, section in data.items():
        if not isinstance(section, dict):
            raise _unknown_key(section_name, f"top-level key in {path}; options live in [sections]")
        for name, value in section.items():
            _set(cfg, f"{section_name}.{name}", value, path)


def help_text() -> str:
    lines = ["usage: python -m torchtitan.train [--section.key VALUE ...]", ""]
    for section_name, cls in _sections().items():
        lines.append(f"[{section_name}]")
        defaults = cls()
        for f in dataclasses.fields(cls):
            default = _toml_value(getattr(defaults, f.name))
            lines.append(f"  --{section_name}.{f.name} ({default})\n      {f.metadata['help']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> JobConfig:
    """Build the config from defaults, the TOML file and CLI overrides, then validate it."""
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(help_text())
        raise SystemExit(0)
    cli = _split_cli(argv)
    cfg = JobConfig()
    for key, value in cli:
        if key == "job.config_file":
            _set(cfg, key, value, "command line")
    if cfg.job.config_file:
        _apply_toml(cfg, _read_toml(cfg.job.config_file), cfg.job.config_file)
    for key, value in cli:
        _set(cfg, key, value, "command line")
    validate(cfg)
    return cfg


# --------------------------------------------------------------------------- validation


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    _check(value in choices, f"--{key} must be one of {', '.join(choices)}; got {value!r}")


def validate(cfg: JobConfig) -> None:
    """Checks that need nothing but the config itself (no files, no devices)."""
    t, o, s = cfg.training, cfg.optimizer, cfg.lr_scheduler
    _check(t.seq_len > 0, f"--training.seq_len must be positive; got {t.seq_len}")
    _check(
        t.local_batch_size > 0,
        f"--training.local_batch_size must be positive; got {t.local_batch_size}",
    )
    _check(
        t.global_batch_size == -1 or t.global_batch_size > 0,
        f"--training.global_batch_size must be positive or -1; got {t.global_batch_size}",
    )
    _check(t.steps > 0, f"--training.steps must be positive; got {t.steps}")
    _check(t.gc_freq > 0, f"--training.gc_freq must be positive; got {t.gc_freq}")
    _check_choice("training.on_nonfinite", t.on_nonfinite, ("stop", "skip"))
    _check_choice(
        "training.mixed_precision_param", t.mixed_precision_param, ("bfloat16", "float32")
    )
    _check_choice(
        "training.mixed_precision_reduce", t.mixed_precision_reduce, ("bfloat16", "float32")
    )
    _check_choice("optimizer.name", o.name, ("AdamW", "Adam"))
    _check_choice(
        "optimizer.implementation", o.implementation, ("auto", "fused", "foreach", "for-loop")
    )
    _check(o.lr >= 0, f"--optimizer.lr must be >= 0; got {o.lr}")
    _check(s.warmup_steps >= 0, f"--lr_scheduler.warmup_steps must be >= 0; got {s.warmup_steps}")
    _check_choice("lr_scheduler.decay_type", s.decay_type, ("linear", "cosine", "none"))
    _check(
        0 <= s.min_lr_ratio <= 1,
        f"--lr_scheduler.min_lr_ratio must be in [0, 1]; got {s.min_lr_ratio}",
    )
    _check(
        cfg.metrics.log_freq > 0, f"--metrics.log_freq must be positive; got {cfg.metrics.log_freq}"
    )
    _check_choice("model.name", cfg.model.name, ("llama3",))
    _check_choice(
        "parallelism.context_parallel_rotate_method",
        cfg.parallelism.context_parallel_rotate_method,
        ("allgather", "alltoall"),
    )
    _check_choice(
        "parallelism.fsdp_reshard_after_forward",
        cfg.parallelism.fsdp_reshard_after_forward,
        ("default", "always", "never"),
    )
    ac = cfg.activation_checkpoint
    _check_choice("activation_checkpoint.mode", ac.mode, ("none", "full", "selective"))
    _check(
        ac.mode != "selective"
        or ac.selective_ac_option == "op"
        or _positive_int(ac.selective_ac_option),
        "--activation_checkpoint.selective_ac_option must be 'op' or a positive integer N; "
        f"got {ac.selective_ac_option!r}",
    )
    _check_choice("activation_checkpoint.save_matmuls", ac.save_matmuls, ("all", "alternate"))
    cfg.checkpoint.validate()
    cfg.comm.validate()
    cfg.profiling.validate()


def _positive_int(text: str) -> bool:
    return text.isdigit() and int(text) > 0
