"""Hugging Face interoperability for the Llama 3 model, without any process group:

* ``mapping``: parameter names and the rotary q/k permutation (state dicts both ways);
* ``config``: config.json <-> ``ModelArgs``;
* ``files``: an HF folder's config.json and safetensors files, read and checked;
* ``tokenizer``: our tokenizer as tokenizer.json + tokenizer_config.json.

Loading HF weights into a sharded model is collective work; it lives in
``torchtitan.checkpoint.hf_load``. docs/hf_interop.md describes the mapping and the scripts.
"""

from torchtitan.models.llama3.hf.config import (
    LLAMA31_MAX_POSITION_EMBEDDINGS,
    check_compatible,
    hf_config_dict,
    llama3_bos_eos,
    matching_flavors,
    model_args_from_hf_config,
)
from torchtitan.models.llama3.hf.files import (
    CONFIG_FILE,
    GENERATION_CONFIG_FILE,
    SAFETENSORS_FILE,
    SAFETENSORS_INDEX_FILE,
    HFCheckpoint,
    hf_tensor_shapes,
    hf_weight_files,
    inspect_hf_checkpoint,
    open_safetensors,
    read_hf_config,
    read_hf_file,
    read_hf_files,
)
from torchtitan.models.llama3.hf.mapping import (
    check_keys,
    check_shapes,
    expected_shapes,
    few_names,
    from_hf_state_dict,
    from_hf_tensor,
    hf_name,
    is_ignored_hf_key,
    our_name,
    permute_from_hf,
    permute_to_hf,
    to_hf_state_dict,
    to_hf_tensor,
    to_hf_tensors,
)
from torchtitan.models.llama3.hf.tokenizer import (
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    build_hf_tokenizer,
    write_hf_tokenizer,
)

__all__ = [
    "CONFIG_FILE",
    "GENERATION_CONFIG_FILE",
    "LLAMA31_MAX_POSITION_EMBEDDINGS",
    "SAFETENSORS_FILE",
    "SAFETENSORS_INDEX_FILE",
    "TOKENIZER_CONFIG_FILE",
    "TOKENIZER_FILE",
    "HFCheckpoint",
    "build_hf_tokenizer",
    "check_compatible",
    "check_keys",
    "check_shapes",
    "expected_shapes",
    "few_names",
    "from_hf_state_dict",
    "from_hf_tensor",
    "hf_config_dict",
    "hf_name",
    "hf_tensor_shapes",
    "hf_weight_files",
    "inspect_hf_checkpoint",
    "is_ignored_hf_key",
    "llama3_bos_eos",
    "matching_flavors",
    "model_args_from_hf_config",
    "open_safetensors",
    "our_name",
    "permute_from_hf",
    "permute_to_hf",
    "read_hf_config",
    "read_hf_file",
    "read_hf_files",
    "to_hf_state_dict",
    "to_hf_tensor",
    "to_hf_tensors",
    "write_hf_tokenizer",
]
