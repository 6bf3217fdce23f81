"""Model families. Each family folder declares its flavors, its model and what the composition
needs to parallelize it (a ``ModelFamily``); ``family_of`` finds a family by its
``--model.name``."""

from torchtitan.models.common import ModelFamily
from torchtitan.models.deepseek_v3.parallelize import DEEPSEEK_V3
from torchtitan.models.llama3.parallelize import LLAMA3
from torchtitan.models.qwen3.parallelize import QWEN3

FAMILIES: dict[str, ModelFamily] = {family.name: family for family in (LLAMA3, QWEN3, DEEPSEEK_V3)}


def family_of(name: str) -> ModelFamily:
    """The family ``--model.name`` names (the config's ``ModelName`` lists the same names)."""
    return FAMILIES[name]


def model_args_from_config(model, seq_len: int):
    """The ``[model]`` section's args in its family (flavor + overrides; ConfigError, one line)."""
    return family_of(model.name).args_from_config(model, seq_len)


__all__ = ["FAMILIES", "ModelFamily", "family_of", "model_args_from_config"]
