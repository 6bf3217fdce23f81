"""Model families. Each family folder declares its flavors, its model and what the composition
needs to parallelize it (a ``ModelFamily``); ``family_of`` finds a family by its
``--model.name``."""

from torchtitan.models.common import ModelFamily
from torchtitan.models.llama3.parallelize import LLAMA3

FAMILIES: dict[str, ModelFamily] = {LLAMA3.name: LLAMA3}


def family_of(name: str) -> ModelFamily:
    """The family ``--model.name`` names (the config's ``ModelName`` lists the same names)."""
    return FAMILIES[name]


__all__ = ["FAMILIES", "ModelFamily", "family_of"]
