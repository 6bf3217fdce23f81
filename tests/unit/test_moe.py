"""The shared Mixture-of-Experts layer: expert compute paths, routing, balancing, compile."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from torchtitan.models.common import MoE, MoEArgs
from torchtitan.models.common.load_balance import (
    collect_aux_loss,
    collect_expert_loads,
    load_imbalance,
    moe_layers,
    update_expert_biases,
)

DIM, HIDDEN = 8, 16


def build(grouped=None, seed=0, dim=DIM, **overrides) -> MoE:
    torch.manual_seed(seed)
    kw = dict(num_experts=4, top_k=2, hidden_dim=HIDDEN) | overrides
    moe = MoE(dim, MoEArgs(**kw), grouped=grouped)
    moe.init_weights(0.3, 0.2)  # large enough that routing and outputs are far from ties
    return moe


def twin(moe: MoE, grouped) -> MoE:
    other = MoE(moe.router.gate.in_features, moe.args, grouped=grouped)
    other.load_state_dict(moe.state_dict())
    return other.to(moe.router.gate.weight.dtype)


def grads(moe: nn.Module) -> dict[str, torch.Tensor]:
    return {n.removeprefix("_orig_mod."): p.grad.clone() for n, p in moe.named_parameters()}


def run(moe: MoE, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    x = x.clone().requires_grad_(True)
    out = moe(x)
    (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), grads(moe) | {"x": x.grad}


# --- expert compute paths --------------------------------------------------------------------


def test_grouped_and_per_expert_paths_agree_in_fp32_with_an_idle_expert():
    moe = build(grouped=True, num_shared_experts=1)
    with torch.no_grad():
        moe.router.expert_bias[3] = -10.0  # expert 3 is never chosen
    ref = twin(moe, grouped=False)
    x = torch.randn(2, 6, DIM)
    out, g = run(moe, x)
    ref_out, ref_g = run(ref, x)
    assert moe.router.tokens_per_expert[3] == 0 and moe.router.tokens_per_expert.sum() == 24
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    assert g.keys() == ref_g.keys()
    for name in g:
        torch.testing.assert_close(g[name], ref_g[name], rtol=1e-5, atol=1e-6, msg=name)
    for w in ("w1", "w2", "w3"):
        assert torch.all(g[f"experts.{w}"][3] == 0), w
        assert g[f"experts.{w}"][:3].abs().sum() > 0, w


def test_bf16_grouped_path_is_close_to_fp32():
    moe = build(grouped=True)
    x = torch.randn(2, 6, DIM)
    ref = moe(x)
    low = twin(moe, grouped=True).to(torch.bfloat16)
    out = low(x.bfloat16())
    assert out.dtype == torch.bfloat16
    assert torch.equal(low.router.tokens_per_expert, moe.router.tokens_per_expert)
    err = (out.float() - ref).norm() / ref.norm()
    assert err < 2e-2, err


def test_auto_choice_of_path():
    from torchtitan.models.common.moe import grouped_mm_usable

    assert grouped_mm_usable(torch.zeros(1, DIM), DIM, HIDDEN)
    assert grouped_mm_usable(torch.zeros(1, DIM, dtype=torch.bfloat16), DIM, HIDDEN)
    assert not grouped_mm_usable(torch.zeros(1, 6), 6, HIDDEN)  # 24-byte rows: unaligned
    assert not grouped_mm_usable(torch.zeros(1, DIM, dtype=torch.float64), DIM, HIDDEN)


# --- dropless: a naive per-token reference ---------------------------------------------------


def naive_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token: softmax over all experts, top-k, renormalise, sum the k SwiGLUs."""
    a, ex = moe.args, moe.experts
    rows = []
    for tok in x.reshape(-1, x.shape[-1]):
        probs = torch.softmax(moe.router.gate.weight @ tok, dim=0)
        chosen = sorted(range(a.num_experts), key=lambda e: -probs[e].item())[: a.top_k]
        total = sum(probs[e] for e in chosen)
        acc = torch.zeros_like(tok)
        for e in chosen:
            h = F.silu(ex.w1[e] @ tok) * (ex.w3[e] @ tok)
            acc = acc + probs[e] / total * (ex.w2[e] @ h)
        if moe.shared_experts is not None:
            acc = acc + moe.shared_experts(tok)
        rows.append(acc)
    return torch.stack(rows).view_as(x)


@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("top_k", [1, 3, 4])
def test_every_token_gets_all_its_experts(grouped, top_k):
    moe = build(grouped=grouped, top_k=top_k, num_shared_experts=2, balance_bias=False)
    x = torch.randn(3, 5, DIM)
    with torch.no_grad():
        torch.testing.assert_close(moe(x), naive_moe(moe, x), rtol=1e-5, atol=1e-6)
    assert moe.router.tokens_per_expert.sum() == 15 * top_k


# --- router -------------------------------------------------------------------------------------


def tiny_router(logits: list[float], **overrides):
    """A router over 3 experts whose gate turns the input [1, 0] into ``logits``."""
    moe = build(dim=2, hidden_dim=4, num_experts=3, top_k=2, **overrides)
    with torch.no_grad():
        moe.router.gate.weight.zero_()
        moe.router.gate.weight[:, 0] = torch.tensor(logits)
    return moe.router, torch.tensor([[1.0, 0.0]])


def route(router, x) -> tuple[list[int], list[float]]:
    weights, experts, _ = router(x)
    return experts[0].tolist(), weights[0].tolist()


def test_router_softmax_normalise_and_scale_match_hand_computation():
    logits = [0.0, math.log(2), math.log(5)]  # softmax: 1/8, 2/8, 5/8
    router, x = tiny_router(logits, normalize_scores=False)
    experts, weights = route(router, x)
    assert experts == [2, 1] and weights == pytest.approx([5 / 8, 2 / 8])
    router, x = tiny_router(logits)
    assert route(router, x)[1] == pytest.approx([5 / 7, 2 / 7])
    router, x = tiny_router(logits, route_scale=2.0)
    assert route(router, x)[1] == pytest.approx([10 / 7, 4 / 7])


def test_router_sigmoid_scores_each_expert_on_its_own():
    logits = [0.0, math.log(3), -math.log(3)]  # sigmoid: 1/2, 3/4, 1/4
    router, x = tiny_router(logits, score_func="sigmoid", normalize_scores=False)
    experts, weights = route(router, x)
    assert experts == [1, 0] and weights == pytest.approx([3 / 4, 1 / 2])
    router, x = tiny_router(logits, score_func="sigmoid")
    assert route(router, x)[1] == pytest.approx([0.6, 0.4])


def test_bias_changes_selection_but_not_the_weights():
    router, x = tiny_router([0.0, math.log(2), math.log(5)])
    with torch.no_grad():
        router.expert_bias.copy_(torch.tensor([0.6, 0.0, 0.0]))  # 0.725, 0.25, 0.625
    experts, weights = route(router, x)
    assert experts == [0, 2] and weights == pytest.approx([1 / 6, 5 / 6])  # from 1/8 and 5/8
    router, x = tiny_router([0.0, math.log(2), math.log(5)], balance_bias=False)
    with torch.no_grad():
        router.expert_bias.copy_(torch.tensor([0.6, 0.0, 0.0]))
    assert route(router, x)[0] == [2, 1]  # bias off: ignored


def test_routing_matches_a_qwen3_style_reference_in_bf16():
    """Softmax in fp32 over the gate's bf16 logits, top-k, divide by the sum, cast back."""
    router = build().router.to(torch.bfloat16)
    x = torch.randn(10, DIM, dtype=torch.bfloat16)
    weights, experts, _ = router(x)
    probs = torch.softmax(F.linear(x, router.gate.weight), dim=-1, dtype=torch.float)
    top, idx = torch.topk(probs, 2, dim=-1)
    assert torch.equal(experts, idx)
    assert torch.equal(weights, (top / top.sum(dim=-1, keepdim=True)).to(torch.bfloat16))


# --- load balancing ---------------------------------------------------------------------------


class TwoLayers(nn.Module):
    def __init__(self, **overrides):
        super().__init__()
        self.layers = nn.ModuleDict({"0": build(seed=1, **overrides), "1": build(seed=2)})
        self.layers["0"].extra = nn.Linear(2, 2)  # a non-MoE module in between

    def forward(self, x):
        return self.layers["1"](self.layers["0"](x))


def test_counters_accumulate_over_micro_batches_and_reset_on_collect():
    model = TwoLayers()
    moes = moe_layers(model)
    assert [name for name, _ in moes] == ["layers.0", "layers.1"]
    x = torch.randn(2, 3, DIM)
    with torch.no_grad():
        model(x)
        first = collect_expert_loads(moes)
        model(x)
        model(x)
    assert first.shape == (2, 4) and first.dtype == torch.float32
    assert torch.all(first.sum(dim=1) == 12)  # 6 tokens x top-2 per layer
    twice = collect_expert_loads([m for _, m in moes])
    assert torch.equal(twice, 2 * first)
    assert all(torch.all(m.router.tokens_per_expert == 0) for _, m in moes)


def test_eval_forwards_and_checkpoint_recompute_are_not_counted():
    moe = build()
    x = torch.randn(2, 3, DIM, requires_grad=True)
    moe.eval()
    moe(x)
    assert moe.router.tokens_per_expert.sum() == 0
    moe.train()
    out = torch.utils.checkpoint.checkpoint(moe, x, use_reentrant=False)
    out.sum().backward()  # re-runs the forward inside backward
    assert moe.router.tokens_per_expert.sum() == 12


def test_bias_update_sign_rule_is_identical_on_every_rank():
    loads = torch.tensor([[10.0, 0.0, 5.0, 5.0], [3.0, 3.0, 3.0, 3.0]])
    ranks = [TwoLayers(), TwoLayers()]
    off = TwoLayers(balance_bias=False)
    for model in [*ranks, off]:
        update_expert_biases(moe_layers(model), loads)
        update_expert_biases(moe_layers(model), loads)
    rate = 1e-3
    first = ranks[0].layers["0"].router.expert_bias
    torch.testing.assert_close(first, torch.tensor([-2 * rate, 2 * rate, 0.0, 0.0]))
    assert torch.equal(ranks[1].layers["0"].router.expert_bias, first)
    assert torch.all(ranks[0].layers["1"].router.expert_bias == 0)  # balanced layer
    assert torch.all(off.layers["0"].router.expert_bias == 0)  # balance_bias off


def test_bias_update_shifts_load_off_an_overloaded_expert():
    moe = build(bias_update_rate=0.05)
    with torch.no_grad():
        moe.router.gate.weight[0] += 2.0  # expert 0 wins almost every token
    x = torch.rand(4, 8, DIM) + 0.5  # positive: the raised gate row always wins
    counts = []
    for _ in range(30):
        with torch.no_grad():
            moe(x)
        loads = collect_expert_loads([moe])
        counts.append(loads[0, 0].item())
        update_expert_biases([moe], loads)
    assert moe.router.expert_bias[0] < 0
    assert counts[-1] < counts[0]


def test_load_imbalance_picks_the_worst_layer_with_tokens():
    loads = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert load_imbalance(loads) == (4.0, 1)
    assert load_imbalance(torch.zeros(2, 4)) == (0.0, -1)


def test_collectives_over_a_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        group = dist.new_group([0])
        moes = [build(aux_loss_coeff=0.1), build(seed=3)]
        for m in moes:
            m(torch.randn(1, 4, DIM))
        aux = moes[0].router.aux_loss_sum.item()
        assert aux > 0
        assert collect_expert_loads(moes, group).sum() == 16
        assert collect_aux_loss(moes, group) == pytest.approx(aux)  # the one layer with it on
        assert collect_aux_loss(moes[1:], group) is None
    finally:
        dist.destroy_process_group()


# --- auxiliary loss ---------------------------------------------------------------------------


def hand_aux_loss(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Loops over sequences and tokens: coeff x mean_b sum_i f_i P_i."""
    a = moe.args
    bs, seq, _ = x.shape
    per_seq = []
    for b in range(bs):
        f = [0.0] * a.num_experts
        p = [0.0] * a.num_experts
        for t in range(seq):
            probs = torch.softmax(moe.router.gate(x[b, t]), dim=0)
            for e in torch.topk(probs.detach(), a.top_k).indices.tolist():
                f[e] += a.num_experts / (a.top_k * seq)
            for e in range(a.num_experts):
                p[e] = p[e] + probs[e] / seq
        per_seq.append(sum(fi * pi for fi, pi in zip(f, p)))
    return a.aux_loss_coeff * sum(per_seq) / bs


def test_aux_loss_value_and_gradient():
    moe = build(aux_loss_coeff=0.01, balance_bias=False)
    plain = MoE(DIM, MoEArgs(num_experts=4, top_k=2, hidden_dim=HIDDEN, balance_bias=False))
    plain.load_state_dict(moe.state_dict())
    x = torch.randn(3, 5, DIM)

    out = moe(x)
    expected = hand_aux_loss(moe, x)
    torch.testing.assert_close(moe.router.aux_loss_sum, expected.detach())
    assert torch.equal(out, plain(x))  # the output is untouched

    (out * 0).sum().backward()  # only the aux loss sends gradient to the gate
    aux_grad = torch.autograd.grad(expected, moe.router.gate.weight)[0]
    torch.testing.assert_close(moe.router.gate.weight.grad, aux_grad)
    assert aux_grad.abs().sum() > 0

    (plain(x) * 0).sum().backward()
    assert torch.all(plain.router.gate.weight.grad == 0)

    moe.zero_grad()
    moe.aux_loss_weight = 0.25
    (moe(x) * 0).sum().backward()
    torch.testing.assert_close(moe.router.gate.weight.grad, 0.25 * aux_grad)


def test_collect_aux_loss_sums_micro_batches_and_resets():
    model = TwoLayers(aux_loss_coeff=0.01)
    x = torch.randn(2, 3, DIM)
    with torch.no_grad():
        model(x)
        one = model.layers["0"].router.aux_loss_sum.item()
        model(x)
    assert one > 0
    assert collect_aux_loss(moe_layers(model)) == pytest.approx(2 * one)  # 1 layer has it on
    assert model.layers["0"].router.aux_loss_sum == 0
    assert collect_aux_loss(moe_layers(TwoLayers())) is None


# --- torch.compile ----------------------------------------------------------------------------


def test_compiled_fp32_matches_eager():
    """fp32 under compile, as a block compiles (one graph): the automatic choice takes the
    masked path (the grouped GEMM's fake-tensor rule is bf16 only, the per-expert loop needs
    the group sizes on the host); eager fp32 on CPU takes the grouped path."""
    torch._dynamo.reset()
    moe = build(num_shared_experts=1, aux_loss_coeff=0.01)
    compiled = twin(moe, grouped=None)
    x = torch.randn(2, 6, DIM)
    out, g = run(moe, x)
    c_out, c_g = run(torch.compile(compiled, fullgraph=True), x)
    torch.testing.assert_close(c_out, out, rtol=1e-5, atol=1e-6)
    for name in g:
        torch.testing.assert_close(c_g[name], g[name], rtol=1e-5, atol=1e-6, msg=name)
    torch.testing.assert_close(compiled.router.tokens_per_expert, moe.router.tokens_per_expert)
    torch.testing.assert_close(compiled.router.aux_loss_sum, moe.router.aux_loss_sum)


def test_grouped_path_compiles_whole_in_bf16_but_not_in_fp32():
    torch._dynamo.reset()
    moe = build(grouped=True).to(torch.bfloat16)
    x = torch.randn(2, 6, DIM, dtype=torch.bfloat16)
    out, g = run(moe, x)
    compiled = twin(moe, grouped=True)
    # aot_eager: the whole forward and backward traced through the fake-tensor rules (where
    # the dtype limit lives) in a fraction of inductor's compile time.
    c_out, c_g = run(torch.compile(compiled, fullgraph=True, backend="aot_eager"), x)
    torch.testing.assert_close(c_out, out)
    for name in g:
        torch.testing.assert_close(c_g[name], g[name], msg=name)
    with pytest.raises(Exception, match="Expected inputs of BF16 type"):
        torch.compile(build(grouped=True), fullgraph=True, backend="eager")(x.float())


# --- args ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(top_k=9), "moe top_k 9 is larger than num_experts 8"),
        (dict(num_experts=0), "moe num_experts must be positive, got 0"),
        (dict(hidden_dim=-1), "moe hidden_dim must be positive, got -1"),
        (dict(top_k=0), "moe top_k must be positive, got 0"),
        (dict(num_shared_experts=-1), "moe num_shared_experts must be >= 0, got -1"),
        (dict(score_func="relu"), "moe score_func 'relu' is not one of softmax, sigmoid"),
        (dict(bias_update_rate=-0.1), "moe bias_update_rate must be >= 0, got -0.1"),
        (dict(aux_loss_coeff=-1.0), "moe aux_loss_coeff must be >= 0, got -1.0"),
        (dict(route_scale=0.0), "moe route_scale must be positive, got 0.0"),
    ],
)
def test_validate_messages(overrides, message):
    args = MoEArgs(**(dict(num_experts=8, top_k=2, hidden_dim=16) | overrides))
    with pytest.raises(ValueError) as err:
        args.validate()
    assert str(err.value) == message
    with pytest.raises(ValueError):
        MoE(DIM, args)


@pytest.mark.parametrize("shared", [0, 2])
def test_params_and_flops(shared):
    args = MoEArgs(num_experts=6, top_k=2, hidden_dim=12, num_shared_experts=shared)
    total, active = args.params(DIM)
    assert total == sum(p.numel() for p in MoE(DIM, args).parameters())
    gate, expert = DIM * 6, 3 * DIM * 12
    assert active == gate + 2 * expert + shared * expert
    assert args.flops_per_token(DIM) == 6 * active
    MoEArgs(num_experts=8, top_k=8, hidden_dim=1).validate()  # the edges are valid
