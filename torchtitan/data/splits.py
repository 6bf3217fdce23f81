"""Dataset splits: ``SPEC@SPLIT`` names a split of a keyword or hub dataset, and the bundled
sample corpus is cut into a training part and a held-out validation part.

``sample`` (= ``sample@train``) is every document but the last ``SAMPLE_VALIDATION_DOCUMENTS``,
``sample@validation`` only those, so training on ``sample`` never sees a validation document.
``c4@validation`` and ``hf:ORG/NAME[:CONFIG]@SPLIT`` read the hub dataset's split of that name. A
local path has no splits: its ``@`` stays part of the path.
"""

from __future__ import annotations

import re

from torchtitan.config import JobConfig
from torchtitan.data.errors import DataError

SPLIT_SEPARATOR = "@"
HUB_PREFIX = "hf:"
KEYWORDS = ("sample", "c4")
TRAIN, VALIDATION = "train", "validation"
# The last 64 of the corpus's 1,209 documents: 68,352 tokens with the bundled tokenizer (7.8%).
SAMPLE_VALIDATION_DOCUMENTS = 64

Rows = tuple[int | None, int | None]  # a slice of the rows: (start, stop), as Python slices


def split_spec(spec: str) -> tuple[str, str | None]:
    """``'c4@validation'`` -> ``('c4', 'validation')``; ``(spec, None)`` without a split."""
    base, separator, split = spec.rpartition(SPLIT_SEPARATOR)
    if not separator or not (base in KEYWORDS or base.startswith(HUB_PREFIX)):
        return spec, None
    if not split:
        raise DataError(f"dataset spec {spec!r} names no split; write {base}@SPLIT")
    return base, split


def sample_rows(split: str | None) -> Rows:
    """The rows of the bundled corpus that make up ``split`` (None = train)."""
    if split in (None, TRAIN):
        return (0, -SAMPLE_VALIDATION_DOCUMENTS)
    if split == VALIDATION:
        return (-SAMPLE_VALIDATION_DOCUMENTS, None)
    raise DataError(
        f"the bundled sample has the splits {TRAIN} and {VALIDATION}; got sample@{split}"
    )


def validation_dataset(cfg: JobConfig) -> str:
    """``validation.dataset``, or by default the training dataset's validation split."""
    if cfg.validation.dataset:
        return cfg.validation.dataset
    base, _ = split_spec(cfg.training.dataset)
    if base in KEYWORDS or base.startswith(HUB_PREFIX):
        return f"{base}{SPLIT_SEPARATOR}{VALIDATION}"
    raise DataError(
        f"training.dataset {cfg.training.dataset!r} is a local path, which has no validation "
        "split; set --validation.dataset to the held-out file or folder, or --validation.enable "
        "false"
    )


def about_validation(error: DataError) -> DataError:
    """``error``, raised while reading the validation data, saying so: its first "dataset"
    becomes "validation dataset" (``dataset path not found: ...`` -> ``validation dataset path
    not found: ...``)."""
    message = str(error)
    if "validation dataset" in message or "--validation.dataset" in message:
        return error
    named, found = re.subn(r"\bdataset\b", "validation dataset", message, count=1)
    return DataError(named if found else f"validation dataset: {message}")


def validation_batch_size(cfg: JobConfig) -> int:
    size = cfg.validation.local_batch_size
    return cfg.training.local_batch_size if size == -1 else size
