"""DeepSeek-V3 (and the DeepSeek-V2 shapes): its shape (``DeepSeekV3Args``), flavors and model
(``DeepSeekV3Transformer``: multi-head latent attention, dense first blocks, MoE blocks with
shared experts), laid out like Llama 3 so the shared composition parallelizes it; ``hf``
converts to and from Hugging Face's DeepSeek-V3 format."""

from torchtitan.models.deepseek_v3.args import DeepSeekV3Args, YarnScaling
from torchtitan.models.deepseek_v3.flavors import (
    MODEL_FLAVORS,
    get_model_args,
    model_args_from_config,
)
from torchtitan.models.deepseek_v3.model import DeepSeekV3Transformer

__all__ = [
    "MODEL_FLAVORS",
    "DeepSeekV3Args",
    "DeepSeekV3Transformer",
    "YarnScaling",
    "get_model_args",
    "model_args_from_config",
]
