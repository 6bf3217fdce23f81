"""Time one compiled Llama 3 block, forward and backward, as the one-GPU trainer runs it.

    python benchmarks/tools/block_step.py [--impl ours|ref] [--rope pairs|swap|complex] [--float8]
        [--recipe tensorwise|rowwise|rowwise_with_gw_hp] [--torchao-backward | --tiled-cast FQN ...]
        [--torchao-input-cast] [--keep-float8-casts] [--eager-column-scales]
        [--residual float32|bfloat16] [--fuse] [--unfused-swiglu]
        [--ac none|selective|full] [--params float32|bfloat16] [--inductor KEY=VALUE ...]
        [--flavor 1B] [--batch 4] [--seq 8192] [--iters 20] [--top 20]

fp32 parameters under bf16 autocast (the one-GPU trainer; ``--params bfloat16``: bf16 parameters
without autocast, what the blocks compute with under FSDP's mixed precision); a block input that
needs its gradient, in the residual stream's dtype (float32: the embedding's output under autocast,
as the model passed it before docs/performance.md finding 23; bfloat16, the default: what it passes
since); the block compiled alone with ``fullgraph=True`` (the trainer compiles each block so);
optionally every linear converted to tensorwise float8 (ours: as the trainer converts them, with
our backward unless ``--torchao-backward``, its feed-forward one fused function unless
``--unfused-swiglu``; ``--tiled-cast`` replaces the model's tiled-cast linears;
rowwise: the inputs' column-wise cast ours unless ``--torchao-input-cast``; our casts recomputed
in the backward unless ``--keep-float8-casts``; the column-wise casts' scales computed in their
cast kernel unless ``--eager-column-scales`` (torchao's amax_to_scale in eager kernels, as before
docs/performance.md finding 33);
ref: torchao's Float8Linear). Prints the median milliseconds of one forward + backward (CUDA
events), the peak memory allocated above the inputs, the kernel time of one traced step by category
(matmul, attention, inductor reductions and pointwise kernels) and its kernels longest first, so
two variants run one after the other on the same GPU compare kernel by kernel. ``--ac`` wraps the
block as each trainer's activation checkpointing does (selective: every other matmul kept, by our
policy or by the reference's own).

``--impl ref`` times the reference framework's block instead (run with ``.peer/torchtitan``
first on PYTHONPATH in place of this repository). ``--rope`` picks the RoPE formulation, all
the same rotation: ``pairs`` (the pairs unbound, rotated and stacked back: the model's form
before finding 23), ``swap`` (x times the cosines plus the pair-swapped x times the signed sines:
the model's own apply_rope, the default), ``complex`` (each pair as one complex number times the
complex angle). Inductor settings come from the environment (``TORCHINDUCTOR_*``) and from
``--inductor KEY=VALUE``.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from cuda_timing import median_ms, peak_gib


def rope_pairs(xq, xk, rope_cache):
    seqlen = xq.shape[1]
    cos, sin = rope_cache[:seqlen].float().chunk(2, dim=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]

    def rotate(x):
        x0, x1 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
        return (
            torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2).type_as(x)
        )

    return rotate(xq), rotate(xk)


def rope_complex(xq, xk, rope_cache):
    seqlen = xq.shape[1]
    cos, sin = rope_cache[:seqlen].float().chunk(2, dim=-1)
    angle = torch.complex(cos, sin)[None, :, None, :]

    def rotate(x):
        pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)).contiguous())
        return torch.view_as_real(pairs * angle).flatten(-2).type_as(x)

    return rotate(xq), rotate(xk)


def fuse_projections(block) -> None:
    """Bench-only variant: wq/wk/wv as one linear and w1/w3 as one, their outputs split (grouped
    K/V go to SDPA as they are, as the model passes them on CUDA)."""
    import types

    import torch.nn.functional as F
    from torch import nn

    def fused(*linears):
        weight = torch.cat([lin.weight for lin in linears])
        out = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device)
        with torch.no_grad():
            out.weight.copy_(weight)
        return out, [lin.weight.shape[0] for lin in linears]

    attn, ffn = block.attention, block.feed_forward
    attn.wqkv, attn.qkv_sizes = fused(attn.wq, attn.wk, attn.wv)
    ffn.w13, ffn.w13_sizes = fused(ffn.w1, ffn.w3)
    del attn.wq, attn.wk, attn.wv, ffn.w1, ffn.w3

    def attention_forward(self, x, rope_cache):
        from torchtitan.models.llama3 import model as llama

        bs, seqlen, _ = x.shape
        xq, xk, xv = self.wqkv(x).split(self.qkv_sizes, dim=-1)
        xq, xk, xv = (t.view(bs, seqlen, -1, self.head_dim) for t in (xq, xk, xv))
        xq, xk = llama.apply_rope(xq, xk, rope_cache)
        q, k, v = (t.transpose(1, 2) for t in (xq, xk, xv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))

    def ffn_forward(self, x):
        a, b = self.w13(x).split(self.w13_sizes, dim=-1)
        return self.w2(F.silu(a) * b)

    attn.forward = types.MethodType(
        lambda self, x, rope, **_: attention_forward(self, x, rope), attn
    )
    ffn.forward = types.MethodType(ffn_forward, ffn)


def ours_block(args):
    from torchtitan.models.llama3 import model as llama
    from torchtitan.models.llama3.args import get_model_args

    forms = {"pairs": rope_pairs, "swap": llama.apply_rope, "complex": rope_complex}
    llama.apply_rope = forms[args.rope]
    margs = get_model_args(args.flavor, max_seq_len=args.seq)
    block = llama.TransformerBlock(0, margs)
    block.init_weights()
    if args.fuse:
        fuse_projections(block)
    rope = llama.precompute_rope_cache(margs.head_dim, args.seq, margs.rope_theta)
    return block, rope, margs.dim


def ref_block(args):
    # The reference's package: run with .peer/torchtitan on PYTHONPATH (see the docstring).
    from torchtitan.models.llama3.model.model import TransformerBlock, precompute_freqs_cis

    from torchtitan.models.llama3 import llama3_args

    margs = llama3_args[args.flavor]
    block = TransformerBlock(0, margs)
    block.init_weights()
    freqs = precompute_freqs_cis(
        margs.dim // margs.n_heads, args.seq, margs.rope_theta, margs.rope_scaling_args
    )
    return block, freqs, margs.dim


def use_eager_column_scales() -> None:
    """Rowwise casts as before finding 33: torchao's ``amax_to_scale`` in eager kernels between
    the column amax and the cast."""
    from torchao.float8.float8_utils import amax_to_scale

    from torchtitan.float8 import cast_kernel as kernel

    def cast(x, amax, float8_dtype, round_to_power_of_2):
        scale = amax_to_scale(amax, float8_dtype, round_to_power_of_2)
        return kernel.cast_transposed(x, scale, float8_dtype), scale

    kernel.cast_columnwise_from_amax = cast


def build(args):
    with torch.device(args.device), torch.no_grad():
        block, rope, dim = (ref_block if args.impl == "ref" else ours_block)(args)
    if args.float8 and args.impl == "ours":  # as the trainer converts them
        from torchtitan.config import Float8
        from torchtitan.float8.convert import apply_float8
        from torchtitan.models.llama3.parallelize import LLAMA3

        cfg = Float8(enable=True, emulate=args.device == "cpu", filter_fqns=[], recipe=args.recipe)
        tiled = LLAMA3.float8_tiled_cast if args.tiled_cast is None else args.tiled_cast
        apply_float8(block, cfg, tiled_cast=tiled)
        if args.torchao_backward:
            for module in block.modules():
                if hasattr(module, "own_backward"):
                    module.own_backward = False
        own = not args.torchao_backward
        if not args.unfused_swiglu and cfg.recipe == "tensorwise" and own:
            from torchtitan.experimental.float8_swiglu import fuse_swiglu

            assert fuse_swiglu(block.feed_forward)
        if args.torchao_input_cast:
            for module in block.modules():
                if hasattr(module, "columnwise_input_cast"):
                    module.columnwise_input_cast = False
        if args.eager_column_scales:
            use_eager_column_scales()
        if args.keep_float8_casts:  # as before the joint-graph pass of float8_recompute.py
            import torch._inductor.config as inductor_config

            inductor_config.joint_custom_pre_pass = None
    elif args.float8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig.from_recipe_name(args.recipe)
        config = dataclasses.replace(config, emulate=args.device == "cpu")
        convert_to_float8_training(block, config=config)
    if args.params == "bfloat16":  # what FSDP's mixed precision computes with
        block.to(torch.bfloat16)
    if args.ac != "none":
        block = wrap_ac(block, args)
    compiled = torch.compile(block, fullgraph=True)
    masks = (None,) if args.impl == "ref" else ()  # the reference's block takes attention masks
    return (lambda x: compiled(x, rope, *masks)), dim


def wrap_ac(block, args):
    """``block`` checkpointed as its trainer wraps each block: ours with every other matmul kept,
    the reference with its own selective-op policy (every other matmul too) or full AC."""
    if args.impl == "ours":
        from torchtitan.parallel.activation_checkpoint import _wrap

        return _wrap(block, selective=args.ac == "selective", save_matmuls="alternate")
    # The reference's package (see the docstring).
    from torchtitan.config.job_config import ActivationCheckpoint
    from torchtitan.distributed import activation_checkpoint as ref_ac
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list

    cfg = ActivationCheckpoint(mode=args.ac, selective_ac_option="op")
    if args.ac == "full":
        return ref_ac._apply_full_ac(block, cfg)
    return ref_ac._apply_op_sac(block, cfg, op_sac_save_list=_op_sac_save_list)


def set_inductor_options(options: list[str]) -> None:
    """Sets ``--inductor KEY=VALUE`` entries (``triton.prefer_nd_tiling=1``) in inductor."""
    from torch._inductor import config

    for option in options:
        key, value = option.split("=", 1)
        *path, name = key.split(".")
        target = config
        for part in path:
            target = getattr(target, part)
        old = getattr(target, name)
        setattr(target, name, type(old)(int(value)) if isinstance(old, bool) else type(old)(value))


def step_fn(args):
    set_inductor_options(args.inductor)
    if args.float8 and args.recipe != "tensorwise" and args.ac != "none":
        # Both trainers round like eager for rowwise under AC (docs/performance.md, finding 12).
        torch._inductor.config.emulate_precision_casts = True
    block, dim = build(args)
    gen = torch.Generator(args.device).manual_seed(0)
    dtype = getattr(torch, args.residual)
    x = torch.randn(args.batch, args.seq, dim, device=args.device, generator=gen).to(dtype)
    x.requires_grad_()
    grad = torch.randn(args.batch, args.seq, dim, device=args.device, generator=gen) * 1e-3
    grad = grad.to(dtype)
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.params == "float32")

    def step():
        with autocast:
            out = block(x)
        out.backward(grad)

    return step


CATEGORIES = (  # (category, substrings of the kernel name), first match wins
    ("attention", ("sdpa", "fmha", "flash", "attention")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma")),
    ("inductor reduction", ("triton_red", "triton_per")),
    ("inductor pointwise", ("triton_poi",)),
)


def category(name: str) -> str:
    lowered = name.lower()
    for label, keys in CATEGORIES:
        if any(key in lowered for key in keys):
            return label
    return "other"


def by_category(kernels: list[tuple[float, int, str]]) -> dict[str, tuple[float, int]]:
    sums: dict[str, list] = {}
    for ms, n, name in kernels:
        entry = sums.setdefault(category(name), [0.0, 0])
        entry[0] += ms
        entry[1] += n
    return {label: (ms, n) for label, (ms, n) in sorted(sums.items(), key=lambda kv: -kv[1][0])}


def all_kernels(step) -> list[tuple[float, int, str]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    totals: dict[str, list] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = totals.setdefault(event.name, [0.0, 0])
            entry[0] += event.device_time / 1e3
            entry[1] += 1
    return sorted(((ms, n, name) for name, (ms, n) in totals.items()), reverse=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=["ours", "ref"], default="ours")
    p.add_argument("--rope", choices=["pairs", "swap", "complex"], default="swap")
    p.add_argument("--residual", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--float8", action="store_true")
    p.add_argument(
        "--recipe", choices=["tensorwise", "rowwise", "rowwise_with_gw_hp"], default="tensorwise"
    )
    p.add_argument(
        "--torchao-backward",
        action="store_true",
        help="ours, float8: torchao's backward",
    )
    p.add_argument(
        "--torchao-input-cast",
        action="store_true",
        help="ours, rowwise: torchao's column-wise cast of the inputs",
    )
    p.add_argument(
        "--keep-float8-casts",
        action="store_true",
        help="ours, float8: without the pass that recomputes our casts in the backward "
        "(float8_recompute.py); without AC the forward runs and keeps them",
    )
    p.add_argument(
        "--eager-column-scales",
        action="store_true",
        help="ours, rowwise: the column-wise casts' scales by torchao's amax_to_scale in eager",
    )
    p.add_argument(
        "--tiled-cast",
        nargs="*",
        metavar="FQN",
        help="ours, float8: the linears whose input cast is tiled (none given: no linear)",
    )
    p.add_argument(
        "--ac",
        choices=["none", "selective", "full"],
        default="none",
        help="checkpoint the block: our selective-op policy keeping every other matmul, or full",
    )
    p.add_argument(
        "--params",
        choices=["float32", "bfloat16"],
        default="float32",
        help="float32 under bf16 autocast (one GPU), or bfloat16 without autocast (FSDP)",
    )
    p.add_argument("--fuse", action="store_true", help="wq/wk/wv and w1/w3 as one linear each")
    p.add_argument(
        "--unfused-swiglu",
        action="store_true",
        help="tensorwise, our backward: the feed-forward as three float8 linears, not one function",
    )
    p.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--flavor", default="1B")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    step = step_fn(args)
    for _ in range(3):
        step()
    label = f"{args.impl} rope={args.rope if args.impl == 'ours' else 'complex(ref)'}"
    label += (f" float8 {args.recipe}" if args.float8 else " bf16") + f" residual={args.residual}"
    label += " torchao backward" if args.torchao_backward else ""
    label += " torchao input cast" if args.torchao_input_cast else ""
    label += " eager column scales" if args.eager_column_scales else ""
    label += f" tiled cast {args.tiled_cast}" if args.tiled_cast is not None else ""
    label += " fused projections" if args.fuse else ""
    label += " unfused swiglu" if args.unfused_swiglu else ""
    label += f" ac={args.ac}" if args.ac != "none" else ""
    label += " bf16 params" if args.params == "bfloat16" else ""
    label += "".join(f" {option}" for option in args.inductor)
    if args.device == "cpu":
        print(f"{label}: ran on CPU (no timing)")
        return
    print(f"{label}: {median_ms(step, args.iters):.3f} ms forward+backward (median)")
    print(f"  peak memory above the inputs {peak_gib(step):.2f} GiB")
    kernels = all_kernels(step)
    for kind, (ms, n) in by_category(kernels).items():
        print(f"  {kind:20s} {ms:8.3f} ms in {n} kernels")
    for ms, n, name in kernels[: args.top]:
        shown = name if len(name) <= 160 else f"{name[:110]}...{name[-47:]}"
        print(f"  {ms:8.3f} ms {n:3d}x  {shown}")


if __name__ == "__main__":
    main()
