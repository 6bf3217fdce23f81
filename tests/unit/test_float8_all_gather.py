"""FSDP's float8 all-gather with our one-kernel weight cast
(torchtitan/float8/all_gather.py) on CPU, emulated, one-rank gloo FSDP2: which weights
get it, that FSDP's shards keep it, that it trains bit for bit as torchao's wrapper does, and that
checkpoints hold plain tensors. The kernel's bits on a GPU: tests/gpu/test_float8_cast_on_gpu.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from tests.unit.test_float8_backward import llama_float8
from torchtitan.config import Float8
from torchtitan.float8.convert import plain_weights, precompute_float8_scales
from torchtitan.models.llama3 import Transformer, get_model_args

GATHER = Float8(enable=True, emulate=True, fsdp_float8_all_gather=True, precompute_scales=True)


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def sharded_model(cfg: Float8, mesh):
    from torchtitan.parallel.fsdp import apply_fsdp

    torch.manual_seed(0)
    model = Transformer(get_model_args("debugmodel", max_seq_len=32))
    model.init_weights()
    conversion = llama_float8(model, cfg, fsdp_sharded=True)
    apply_fsdp(model, mesh, param_dtype=torch.bfloat16)
    return model, conversion


def train_steps(model, cfg: Float8, steps: int = 2) -> list[torch.Tensor]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(256, (2, 32), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(steps):
        precompute_float8_scales([model], cfg)
        loss = model(tokens).float().square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return losses + [p.full_tensor().detach() for p in model.parameters()]


def local_weights(model) -> dict[str, torch.Tensor]:
    return {
        name: param.to_local()
        for name, param in model.named_parameters()
        if name.endswith("weight") and param.ndim == 2
    }


def test_fsdp_shards_keep_our_wrapper_and_gather_through_our_cast(one_rank, monkeypatch):
    from torchtitan.float8 import all_gather as float8_all_gather
    from torchtitan.float8.all_gather import Float8AllGatherWeight

    calls = []
    cast = float8_all_gather.cast_to_float8
    monkeypatch.setattr(
        float8_all_gather, "cast_to_float8", lambda *a: calls.append(a[0].shape) or cast(*a)
    )
    model, conversion = sharded_model(GATHER, one_rank)
    block_linears = 7 * len(model.layers)
    assert conversion.fused_all_gather_casts == len(conversion.converted) == block_linears
    ours = [n for n, w in local_weights(model).items() if type(w) is Float8AllGatherWeight]
    assert len(ours) == block_linears and all(".layers." in f".{n}" for n in ours)
    train_steps(model, GATHER, steps=1)
    # each block gathered for the forward and again for the backward (resharded after forward)
    assert len(calls) == 2 * block_linears
    assert all(
        type(w) is Float8AllGatherWeight for n, w in local_weights(model).items() if n in ours
    )


def test_trains_bit_for_bit_as_torchaos_wrapper(one_rank, monkeypatch):
    from torchtitan.float8 import all_gather as float8_all_gather

    with monkeypatch.context() as torchaos:  # torchao's wrapper and cast
        torchaos.setattr(float8_all_gather, "use_fused_all_gather_cast", lambda model: 0)
        model, conversion = sharded_model(GATHER, one_rank)
        assert conversion.fused_all_gather_casts == 0
        want = train_steps(model, GATHER)
    got = train_steps(sharded_model(GATHER, one_rank)[0], GATHER)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


def test_not_used_without_precomputed_scales(one_rank):
    cfg = dataclasses.replace(GATHER, precompute_scales=False)
    assert sharded_model(cfg, one_rank)[1].fused_all_gather_casts == 0


def test_checkpoints_hold_the_plain_weights(one_rank):
    from torchtitan.float8.all_gather import Float8AllGatherWeight

    model, _ = sharded_model(GATHER, one_rank)
    state = plain_weights(model.state_dict())
    kinds = {type(value.to_local()) for value in state.values()}
    assert Float8AllGatherWeight not in kinds and kinds == {torch.Tensor}


def test_the_log_line_counts_them(one_rank, caplog):
    with caplog.at_level("INFO", logger="torchtitan"):
        model, _ = sharded_model(GATHER, one_rank)
    assert (
        f"{7 * len(model.layers)} weights cast for FSDP's float8 all-gather in one kernel"
        in caplog.text
    )
