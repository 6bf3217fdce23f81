"""Hugging Face interoperability for the Qwen3 model, without any process group:

* ``mapping``: tensor names and the per-expert split (state dicts both ways);
* ``config``: config.json <-> ``Qwen3Args``.

Reading and writing HF folders (config.json, safetensors) is the same as for Llama 3:
``torchtitan.models.llama3.hf.files``.
"""

from torchtitan.models.qwen3.hf.config import (
    QWEN3_BOS_EOS,
    check_compatible,
    hf_config_dict,
    matching_flavors,
    model_args_from_hf_config,
)
from torchtitan.models.qwen3.hf.mapping import (
    EXPERT_BIAS,
    check_keys,
    check_shapes,
    expected_hf_names,
    expected_shapes,
    from_hf_state_dict,
    hf_expert_name,
    hf_name,
    is_ignored_hf_key,
    our_name,
    to_hf_state_dict,
)

__all__ = [
    "EXPERT_BIAS",
    "QWEN3_BOS_EOS",
    "check_compatible",
    "check_keys",
    "check_shapes",
    "expected_hf_names",
    "expected_shapes",
    "from_hf_state_dict",
    "hf_config_dict",
    "hf_expert_name",
    "hf_name",
    "is_ignored_hf_key",
    "matching_flavors",
    "model_args_from_hf_config",
    "our_name",
    "to_hf_state_dict",
]
