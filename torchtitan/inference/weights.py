"""Model weights for inference in one process: a DCP checkpoint or a Hugging Face folder.

``locate_weights`` and ``model_args_for`` only read metadata (DCP ``.metadata``, HF config.json
and safetensors headers), so every mistake is reported in one line before any model is built;
``load_model`` then reads the tensors. No process group is needed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from torchtitan.checkpoint import CheckpointError, find_checkpoint, load_safely, read_metadata
from torchtitan.checkpoint.errors import describe_error
from torchtitan.config import ConfigError, JobConfig, Model
from torchtitan.models.llama3 import (
    MODEL_FLAVORS,
    ModelArgs,
    Transformer,
    hf,
    model_args_from_config,
)

MODEL_PREFIX = "model."


@dataclasses.dataclass
class WeightsSource:
    path: Path  # a complete DCP step folder, or an HF folder
    in_hf: bool
    note: str = ""  # what was inferred about the path, for the user


def looks_like_hf(path: Path) -> bool:
    return (path / hf.CONFIG_FILE).is_file() and any(path.glob("*.safetensors"))


def locate_weights(path: str | Path, in_hf: bool = False) -> WeightsSource:
    """What ``--checkpoint.initial_load_path`` points at: an HF folder (``in_hf``, or one with
    config.json and safetensors files), a DCP ``step-N`` folder, or a folder of them (the latest
    complete step)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"checkpoint path {path} does not exist")
    if in_hf:
        return WeightsSource(path, True)
    if looks_like_hf(path):
        note = (
            f"{path} holds config.json and safetensors files: loading it as a Hugging Face folder"
        )
        return WeightsSource(path, True, note)
    ckpt = find_checkpoint(path)
    note = f"latest complete checkpoint in {path}: {ckpt.name}" if ckpt != path else ""
    return WeightsSource(ckpt, False, note)


def dcp_model_tensors(ckpt: str | Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Parameter name -> (shape, stored dtype) of a DCP checkpoint's ``model.*`` entries, from its
    metadata only."""
    metadata = read_metadata(ckpt)
    out = {}
    for key, md in metadata.state_dict_metadata.items():
        if key.startswith(MODEL_PREFIX) and isinstance(md, TensorStorageMetadata):
            out[key[len(MODEL_PREFIX) :]] = (tuple(md.size), md.properties.dtype)
    if not out:
        raise ValueError(f"checkpoint {ckpt} holds no model weights (no 'model.*' keys)")
    return out


def flavors_fitting(shapes: dict[str, tuple[int, ...]]) -> list[str]:
    return [n for n, a in MODEL_FLAVORS.items() if hf.expected_shapes(a) == shapes]


def stored_sizes(shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """The sizes a model's tensor shapes show: vocab_size, dim, n_layers, the feed-forward's
    hidden size, the key/value width (those the shapes hold)."""
    sizes = {}
    if len(embedding := shapes.get("tok_embeddings.weight", ())) == 2:
        sizes["vocab_size"], sizes["dim"] = embedding
    sizes["n_layers"] = len({k.split(".")[1] for k in shapes if k.startswith("layers.")})
    if w1 := shapes.get("layers.0.feed_forward.w1.weight"):
        sizes["feed-forward hidden size"] = w1[0]
    if wk := shapes.get("layers.0.attention.wk.weight"):
        sizes["n_kv_heads x head_dim"] = wk[0]
    return sizes


def _described(model: Model) -> str:
    """``--model.flavor F`` and the shape options given with it."""
    given = " ".join(f"--model.{k} {v}" for k, v in model.shape_overrides().items())
    return f"--model.flavor {model.flavor}" + (f" with {given}" if given else "")


def _hint(fits: list[str], model: Model, differences: dict[str, tuple[int, int]]) -> str:
    """What to change so that the model matches the checkpoint."""
    overrides = ", ".join(f"--model.{k}" for k in model.shape_overrides())
    if model.flavor in fits:  # the flavor fits: an override made the difference
        return f"drop {overrides}: flavor {model.flavor} as it is fits it"
    if fits:
        without = f" (without {overrides})" if overrides else ""
        return f"--model.flavor {' or '.join(fits)} fits it{without}"
    if differences and all(k in ("vocab_size", "dim", "n_layers") for k in differences):
        return "set " + " ".join(f"--model.{k} {stored}" for k, (stored, _) in differences.items())
    return "no flavor fits it: set the --model shape options it was trained with"


def check_dcp_shapes(ckpt: Path, args: ModelArgs, model: Model) -> None:
    """One-line ConfigError when the checkpoint's tensors do not fit ``args`` (the ``[model]``
    section ``model``): the sizes that differ and what to change."""
    shapes = {k: shape for k, (shape, _) in dcp_model_tensors(ckpt).items()}
    try:
        hf.check_keys(shapes, hf.expected_shapes(args), "it")
        hf.check_shapes(shapes, args, "it")
    except ValueError as e:
        stored, wanted = stored_sizes(shapes), stored_sizes(hf.expected_shapes(args))
        differences = {k: (v, wanted[k]) for k, v in stored.items() if wanted.get(k) != v}
        what = ", ".join(f"{k} {a} vs {b}" for k, (a, b) in differences.items())
        what = f"{what} (checkpoint vs model)" if what else str(e)
        hint = _hint(flavors_fitting(shapes), model, differences)
        raise ConfigError(
            f"checkpoint {ckpt} does not match {_described(model)}: {what}; {hint}"
        ) from None


def model_args_for(source: WeightsSource, cfg: JobConfig) -> ModelArgs:
    """DCP: the job's model (flavor, ``[model]`` overrides, ``training.seq_len`` as context),
    checked against the stored shapes. HF: the args its config.json describes (the flavor is not
    used), checked against the safetensors headers."""
    if source.in_hf:
        try:
            return hf.inspect_hf_checkpoint(source.path).args
        except ValueError as e:
            raise ConfigError(f"HF folder {source.path}: {e}") from None
    args = model_args_from_config(cfg.model, cfg.training.seq_len)
    check_dcp_shapes(source.path, args, cfg.model)
    return args


def empty_model(args: ModelArgs, device: torch.device, dtype: torch.dtype) -> Transformer:
    """The model on ``device`` with uninitialised parameters in ``dtype`` (every one is loaded
    next; initialising them would cost more than loading) and its RoPE cache in float32."""
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device=device)
    model.to(dtype)
    model.init_rope_cache(device)
    return model.eval()


def load_dcp(model: Transformer, ckpt: Path) -> None:
    state = {"model": model.state_dict()}  # the parameters themselves: loaded in place
    try:
        load_safely(state, ckpt)
    except (Exception, CheckpointException) as e:  # the latter is a BaseException
        raise CheckpointError(f"could not load {ckpt}: {describe_error(e)}") from None


def load_hf(model: Transformer, folder: Path) -> None:
    ckpt = hf.inspect_hf_checkpoint(folder, model.args)
    missing = set(model.state_dict())
    for path in ckpt.files:
        sd = hf.read_hf_file(path, model.args, ckpt.tie_word_embeddings)
        model.load_state_dict(sd, strict=False)
        missing -= set(sd)
    if missing:  # inspect_hf_checkpoint has checked the names; this guards the uninitialised rest
        raise CheckpointError(f"HF folder {folder} lacks {hf.few_names(missing)}")


def load_model(
    source: WeightsSource, args: ModelArgs, device: torch.device, dtype: torch.dtype
) -> Transformer:
    model = empty_model(args, device, dtype)
    if source.in_hf:
        load_hf(model, source.path)
    else:
        load_dcp(model, source.path)
    return model
