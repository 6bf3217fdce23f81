"""Qwen3 (dense and MoE): its shape (``Qwen3Args``), flavors and model (``Qwen3Transformer``),
laid out like Llama 3 so the shared composition parallelizes it; ``hf`` converts to and from
Hugging Face's Qwen3 / Qwen3-MoE."""

from torchtitan.models.qwen3.args import Qwen3Args
from torchtitan.models.qwen3.flavors import MODEL_FLAVORS, get_model_args, model_args_from_config
from torchtitan.models.qwen3.model import Qwen3Transformer

__all__ = [
    "MODEL_FLAVORS",
    "Qwen3Args",
    "Qwen3Transformer",
    "get_model_args",
    "model_args_from_config",
]
