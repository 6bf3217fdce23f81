"""Reading DCP checkpoints without unpickling arbitrary objects.

DCP reads ``.metadata`` with plain ``pickle.load`` and non-tensor values with
``torch.load(weights_only=False)``. ``SafeFileSystemReader`` unpickles the metadata with an
unpickler that only knows DCP's metadata types; ``SafeLoadPlanner`` first loads every non-tensor
value with ``torch.load(weights_only=True)``. ``load_safely`` is ``dcp.load`` with both.
"""

from __future__ import annotations

import collections
import importlib
import io
import pathlib
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import StorageMeta

_PATH_CLASSES = ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath")


def _allowed_global(module: str, name: str):
    """The object a DCP ``.metadata`` pickle may refer to, or None."""
    if "." in name:
        return None
    if module == "torch.distributed.checkpoint.metadata":
        obj = getattr(importlib.import_module(module), name, None)
        return obj if isinstance(obj, type) and obj.__module__ == module else None
    if (module, name) == ("torch.distributed.checkpoint.filesystem", "_StorageInfo"):
        return getattr(importlib.import_module(module), name)
    if (module, name) == ("torch.serialization", "_get_layout"):
        return torch.serialization._get_layout
    if module == "torch":
        obj = getattr(torch, name, None)
        if name == "Size" or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
            return obj
        return None
    if module in ("pathlib", "pathlib._local") and name in _PATH_CLASSES:
        return getattr(pathlib, name)
    if (module, name) == ("collections", "OrderedDict"):
        return collections.OrderedDict
    return None


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        obj = _allowed_global(module, name)
        if obj is None:
            raise pickle.UnpicklingError(
                f"checkpoint metadata refers to {module}.{name}, which is not a DCP metadata type"
            )
        return obj


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``.metadata`` unpickling only accepts DCP's metadata types."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        with self.fs.create_stream(self.fs.concat_path(self.path, name), "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = getattr(self, "load_id", None)
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` whose non-tensor values must pass ``torch.load(weights_only=True)``.

    DCP's own ``load_bytes`` unpickles with ``weights_only=False``. Every value is first loaded
    with ``weights_only=True`` (which refuses any pickle that names a non-allowlisted global) and
    only then handed to the parent, which stores it where it belongs in the state dict.
    """

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        torch.load(value, weights_only=True)
        value.seek(0)
        super().load_bytes(read_item, value)


def read_metadata(path: str | Path):
    """A DCP checkpoint's metadata (every entry's key, shape and dtype), read safely."""
    return SafeFileSystemReader(str(path)).read_metadata()


def read_state_names(path: str | Path) -> set[str]:
    """Top-level states a DCP checkpoint holds ("model", "optimizer", ...), from its metadata."""
    return {key.split(".", 1)[0] for key in read_metadata(path).state_dict_metadata}


def load_safely(state: dict[str, Any], path: str | Path, distributed: bool = False) -> None:
    """``dcp.load`` of ``path`` into ``state`` (in place) with the safe reader and planner.

    ``distributed``: a collective over the default process group; else this process alone.
    """
    dcp.load(
        state,
        storage_reader=SafeFileSystemReader(str(path)),
        planner=SafeLoadPlanner(),
        no_dist=not distributed,
    )
