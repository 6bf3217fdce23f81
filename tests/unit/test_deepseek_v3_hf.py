"""DeepSeek-V3 <-> Hugging Face: logits equal to transformers' ``DeepseekV3ForCausalLM`` on a
tiny config (fp32, CPU) with YaRN, a query latent, group-limited routing and a nonzero selection
bias, imported from and exported to safetensors folders; float8 block-scaled weights
dequantized on import; multi-token-prediction layers skipped."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("safetensors")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from torchtitan.models.deepseek_v3 import DeepSeekV3Transformer  # noqa: E402
from torchtitan.models.deepseek_v3 import hf as ds_hf  # noqa: E402

TINY = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    first_k_dense_replace=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    q_lora_rank=24,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=12,
    max_position_embeddings=1280,
    rope_scaling={
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 32,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 0.8,  # != mscale: the cos/sin factor is not 1
    },
)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """An HF DeepSeek-V3 folder (save_pretrained) with random weights and selection biases."""
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**TINY)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:  # norms: not all ones, so a swapped norm would show
                p.copy_(1 + 0.1 * torch.randn_like(p))
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.copy_(0.05 * torch.randn(8))
    folder = tmp_path_factory.mktemp("ds_hf")
    model.save_pretrained(folder)
    return folder, model


def _tokens() -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(1))


def _load_ours(folder) -> DeepSeekV3Transformer:
    ckpt = ds_hf.inspect_hf_checkpoint(folder)
    model = DeepSeekV3Transformer(ckpt.args).eval()
    sd = {}
    for part in ds_hf.read_hf_files(ckpt, ckpt.args):
        sd.update(part)
    model.load_state_dict(sd, strict=True)
    return model


def test_imported_logits_equal_transformers(hf_folder):
    folder, hf_model = hf_folder
    ours = _load_ours(folder)
    assert ours.args.rope_scaling.mscale_all_dim == 0.8 and ours.args.moe.num_groups == 4
    tokens = _tokens()
    with torch.no_grad():
        expected = hf_model(tokens).logits
        got = ours(tokens)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_exported_folder_loads_in_transformers(hf_folder, tmp_path):
    folder, hf_model = hf_folder
    ours = _load_ours(folder)
    sd = ds_hf.to_hf_state_dict(ours.state_dict(), ours.args)
    assert sd.keys() == load_file(str(folder / "model.safetensors")).keys()
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    config = ds_hf.hf_config_dict(ours.args, max_position_embeddings=1280)
    (tmp_path / "config.json").write_text(json.dumps(config))
    reloaded = transformers.DeepseekV3ForCausalLM.from_pretrained(tmp_path).eval()
    tokens = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(tokens).logits, hf_model(tokens).logits)


def _blockwise_reference(w: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    out = torch.empty(w.shape)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            rows, cols = slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block)
            out[rows, cols] = w[rows, cols].float() * scale[i, j]
    return out


def test_dequantize_matches_per_block_scaling():
    w = torch.randn(300, 200).to(torch.float8_e4m3fn)  # 3 x 2 blocks, ragged edges
    scale = torch.rand(3, 2) + 0.5
    got = ds_hf.dequantize(w, scale, (128, 128))
    torch.testing.assert_close(got, _blockwise_reference(w, scale, 128), rtol=0, atol=0)


def _quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8 weight, 128x128-block scale_inv) of a weight smaller than one block."""
    scale = w.abs().max().clamp(min=1e-12) / 448.0
    return (w / scale).to(torch.float8_e4m3fn), scale.reshape(1, 1).float()


def test_float8_checkpoint_is_dequantized_and_mtp_skipped(hf_folder, tmp_path):
    folder, _ = hf_folder
    tensors = load_file(str(folder / "model.safetensors"))
    quantized, expected = {}, {}
    for name, t in tensors.items():
        if t.dim() == 2 and "proj" in name:  # linears, as DeepSeek quantizes them
            w, scale = _quantize(t)
            quantized[name], quantized[name + "_scale_inv"] = w, scale
            expected[name] = _blockwise_reference(w, scale, 128)
        else:
            quantized[name] = t
    # A multi-token-prediction layer after the last block (index n_layers), ignored on import.
    quantized["model.layers.3.eh_proj.weight"] = torch.zeros(4, 4)
    save_file(quantized, str(tmp_path / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ours = _load_ours(tmp_path)
    assert expected["model.layers.0.self_attn.q_a_proj.weight"].dtype == torch.float32
    for name, want in expected.items():
        if ".mlp.experts." in name:
            continue  # stacked: checked through one expert below
        ours_name = ds_hf.our_name(name, ours.args)
        torch.testing.assert_close(ours.state_dict()[ours_name], want, rtol=0, atol=0)
    stacked = ours.state_dict()["layers.2.moe.experts.w3"][5]
    want = expected["model.layers.2.mlp.experts.5.up_proj.weight"]
    torch.testing.assert_close(stacked, want, rtol=0, atol=0)


def test_softmax_flavor_is_refused_on_export():
    from torchtitan.models.deepseek_v3 import get_model_args

    with pytest.raises(ValueError, match="sigmoid"):
        ds_hf.hf_config_dict(get_model_args("16B"))
