"""Hugging Face interoperability for DeepSeek-V3, without any process group:

* ``mapping``: tensor names and the per-expert split (state dicts both ways);
* ``config``: config.json <-> ``DeepSeekV3Args``;
* ``files``: an HF folder's config.json and safetensors files, read and checked, float8
  block-scaled weights dequantized (the folder format is Llama's).

The functions the scripts and ``torchtitan.checkpoint.hf_load`` call have the names and
signatures of ``torchtitan.models.llama3.hf``'s, so any family's package serves.
"""

from torchtitan.models.deepseek_v3.hf.config import (
    DEEPSEEK_V3_BOS_EOS,
    check_compatible,
    hf_config_dict,
    matching_flavors,
    model_args_from_hf_config,
)
from torchtitan.models.deepseek_v3.hf.files import (
    dequantize,
    inspect_hf_checkpoint,
    read_hf_files,
)
from torchtitan.models.deepseek_v3.hf.mapping import (
    EXPERT_BIAS,
    check_keys,
    check_shapes,
    expected_hf_names,
    expected_hf_shapes,
    expected_shapes,
    from_hf_state_dict,
    hf_expert_name,
    hf_expert_source,
    hf_name,
    is_ignored_hf_key,
    our_name,
    to_hf_state_dict,
    to_hf_tensors,
)
from torchtitan.models.llama3.hf.files import (
    CONFIG_FILE,
    GENERATION_CONFIG_FILE,
    SAFETENSORS_FILE,
    SAFETENSORS_INDEX_FILE,
    HFCheckpoint,
    read_hf_config,
)
from torchtitan.models.qwen3.hf.mapping import few_names

__all__ = [
    "CONFIG_FILE",
    "DEEPSEEK_V3_BOS_EOS",
    "EXPERT_BIAS",
    "GENERATION_CONFIG_FILE",
    "SAFETENSORS_FILE",
    "SAFETENSORS_INDEX_FILE",
    "HFCheckpoint",
    "check_compatible",
    "check_keys",
    "check_shapes",
    "dequantize",
    "expected_hf_names",
    "expected_hf_shapes",
    "expected_shapes",
    "few_names",
    "from_hf_state_dict",
    "hf_config_dict",
    "hf_expert_name",
    "hf_expert_source",
    "hf_name",
    "inspect_hf_checkpoint",
    "is_ignored_hf_key",
    "matching_flavors",
    "model_args_from_hf_config",
    "our_name",
    "read_hf_config",
    "read_hf_files",
    "to_hf_state_dict",
    "to_hf_tensors",
]
