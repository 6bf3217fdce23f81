"""The attention kernel call shared by the model families: SDPA, FlexAttention or varlen, under
the mask of ``masks.py``. Queries, keys and values come as (batch, seq, heads, head_dim), keys
and values possibly with fewer (grouped) heads; the output has the queries' shape."""

from __future__ import annotations

import functools
import importlib
import inspect

import torch
import torch.nn.functional as F

from torchtitan.models.common.masks import (
    FLEX_BLOCK,
    AttentionMask,
    DenseMask,
    FlexMask,
    VarlenMask,
)


def native_gqa(x: torch.Tensor) -> bool:
    """Whether SDPA's flash kernel will take grouped K/V heads as they are (``enable_gqa``).

    That saves the n_rep-times larger K/V copies (memory saved for backward, bandwidth, and the
    K/V that ring attention exchanges). It holds on CPU and for 16-bit CUDA inputs; for fp32 on
    CUDA the efficient kernel runs, which lacks GQA, and ``enable_gqa`` would fall back to the
    math kernel (a full seq x seq attention matrix), so K/V are repeated instead.
    """
    return x.device.type == "cpu" or x.dtype in (torch.bfloat16, torch.float16)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(bs, seqlen, n_kv_heads, head_dim) -> (bs, seqlen, n_kv_heads * n_rep, head_dim)."""
    if n_rep == 1:
        return x
    bs, seqlen, n_kv_heads, head_dim = x.shape
    x = x[:, :, :, None, :].expand(bs, seqlen, n_kv_heads, n_rep, head_dim)
    return x.reshape(bs, seqlen, n_kv_heads * n_rep, head_dim)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: AttentionMask = None,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v for (batch, seq, heads, head_dim) inputs."""
    if isinstance(mask, VarlenMask):
        return _varlen(q, k, v, mask, scale)
    if mask is not None and mask.gather_kv is not None:  # context parallel: all keys, values
        k, v = mask.gather_kv(k), mask.gather_kv(v)
    n_rep = q.shape[2] // k.shape[2]
    gqa = n_rep > 1 and (isinstance(mask, FlexMask) or native_gqa(q))
    if n_rep > 1 and not gqa:
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (batch, heads, seq, head_dim)
    if isinstance(mask, FlexMask):
        out = compiled_flex_attention()(
            q, k, v, block_mask=mask.block_mask, scale=scale, enable_gqa=gqa
        )
    elif isinstance(mask, DenseMask):
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask.allowed, scale=scale, enable_gqa=gqa
        )
    else:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2)


@functools.cache
def compiled_flex_attention():
    """FlexAttention compiled once per process: uncompiled, it materializes the full score
    matrix. Inside a compiled block the call is traced into the block's graph instead."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


@functools.cache
def _varlen_causal_kwargs() -> dict:
    """torch's ``varlen_attn`` asked for causal attention in its own version's words: newer
    releases take a window ``(-1, 0)`` (and grouped K/V), older ones ``is_causal``."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        return {"window_size": (-1, 0)}
    return {"is_causal": True}


def varlen_takes_gqa() -> bool:
    from torch.nn.attention.varlen import varlen_attn

    return "enable_gqa" in inspect.signature(varlen_attn).parameters


def _varlen(q, k, v, mask: VarlenMask, scale: float | None) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    batch, seq_len = q.shape[:2]
    n_rep = q.shape[2] // k.shape[2]
    kwargs = dict(_varlen_causal_kwargs())
    if n_rep > 1 and varlen_takes_gqa():
        kwargs["enable_gqa"] = True
    elif n_rep > 1:
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    if scale is not None:
        kwargs["scale"] = scale
    q, k, v = (t.flatten(0, 1) for t in (q, k, v))  # (tokens, heads, head_dim)
    cu, n = mask.cu_seqlens, mask.max_len
    out = varlen_attn(q, k, v, cu, cu, n, n, **kwargs)
    return out.unflatten(0, (batch, seq_len))


def attention_problem(options, seq_len: int, cp: int, cuda: bool, compute_dtype: str) -> str | None:
    """Why ``options`` (AttentionOptions) cannot train here, in one line, or None."""
    flag = f"--model.attention {options.kernel}"
    if options.kernel == "sdpa":
        return None
    if not cuda:
        return (
            f"{flag} needs a CUDA GPU (on CPU FlexAttention has no backward and varlen no "
            "kernel); use --model.attention sdpa, which runs --model.mask document with a "
            "dense mask"
        )
    module = "flex_attention" if options.kernel == "flex" else "varlen"
    try:
        importlib.import_module(f"torch.nn.attention.{module}")
    except ImportError:
        return f"{flag} needs torch.nn.attention.{module}, which torch {torch.__version__} lacks"
    if options.kernel == "flex":
        block = FLEX_BLOCK * 2 * cp if cp > 1 else FLEX_BLOCK
        if seq_len % block:
            return f"{flag} needs --training.seq_len divisible by {block}; got {seq_len}"
        return None
    if cp > 1:
        return f"{flag} does not run under context parallelism; use --model.attention flex"
    if compute_dtype != "bfloat16":
        return f"{flag} runs in bf16 only; set --training.mixed_precision_param bfloat16"
    if torch.cuda.get_device_capability() < (8, 0):
        return f"{flag} needs an Ampere or newer GPU (flash attention)"
    return None
