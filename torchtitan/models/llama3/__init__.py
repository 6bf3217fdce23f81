from torchtitan.models.llama3.args import (
    MODEL_FLAVORS,
    ModelArgs,
    get_model_args,
    model_args_from_config,
)
from torchtitan.models.llama3.kv_cache import KVCache
from torchtitan.models.llama3.model import Transformer

__all__ = [
    "MODEL_FLAVORS",
    "KVCache",
    "ModelArgs",
    "Transformer",
    "get_model_args",
    "model_args_from_config",
]
