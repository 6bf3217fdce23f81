"""Decoding speed on one GPU: our KV-cache loop (``torchtitan.inference.generation``, what
``python -m torchtitan.generate`` runs; on a GPU it replays each step as a CUDA graph, ``--eager``
launches it from Python) beside transformers' ``generate`` (eager) on a model of the same shapes,
both bf16, greedy, random weights (speed does not depend on them).

    python benchmarks/tools/generate_speed.py --flavor 8B --prompt-tokens 512 --new-tokens 256
    python benchmarks/tools/generate_speed.py --flavor 8B --batch 16   # 16 distinct prompts at once

Prints per implementation and run (the first, cold, then ``--repeats`` more): the prompts' pass
(time to the first tokens), the decode rate after it (new tokens per second over the batch, and
milliseconds per step), and the peak memory allocated. The prompts of a batch have the same
length, so transformers needs no padding. ``--sdpa`` restricts attention to one backend.
"""

from __future__ import annotations

import argparse
import functools
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from torchtitan.inference.generation import generate_batch
from torchtitan.inference.sampling import Sampling, TokenSampler
from torchtitan.inference.weights import empty_model
from torchtitan.models.llama3 import Transformer, get_model_args
from torchtitan.models.llama3.hf.config import hf_config_dict

BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def random_ours(flavor: str, context: int) -> Transformer:
    """The model as torchtitan.generate loads it (bf16, float32 RoPE table), random weights."""
    model = empty_model(
        get_model_args(flavor, max_seq_len=context), torch.device("cuda"), torch.bfloat16
    )
    model.init_weights()
    return model


def random_hf(flavor: str, context: int):
    import transformers

    config = transformers.LlamaConfig(
        **hf_config_dict(get_model_args(flavor, max_seq_len=context), dtype="bfloat16")
    )
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    return model.eval()


def timed_ours(
    model, prompts: list[list[int]], new_tokens: int, graph: bool
) -> tuple[float, float]:
    """-> (seconds to the first tokens, seconds for the rest)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    first = None
    greedy = TokenSampler(Sampling(temperature=0), sequences=len(prompts))
    for _ in generate_batch(model, prompts, new_tokens, greedy, cuda_graph=graph):
        first = first or time.perf_counter()  # each step's tokens are read on the host
    return first - start, time.perf_counter() - first


def timed_hf(model, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    ids = torch.tensor(prompts, device="cuda")
    kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)

    def run(n: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kwargs)
        torch.cuda.synchronize()
        assert out.shape[1] == ids.shape[1] + n
        return time.perf_counter() - start

    prefill = run(1)
    return prefill, run(new_tokens) - prefill


def measure(name: str, model, timed, prompts: list[list[int]], new_tokens: int, repeats: int):
    """The first run (cold: cuBLAS/cuDNN plans, the allocator) and ``repeats`` more."""
    torch.cuda.reset_peak_memory_stats()
    for run in range(repeats + 1):
        prefill, rest = timed(model, prompts, new_tokens)
        print(
            f"{name:<24} {'cold' if run == 0 else f'run {run}'}: first token "
            f"{prefill * 1e3:8.1f} ms  decode {len(prompts) * (new_tokens - 1) / rest:7.1f} "
            f"tokens/s ({rest / (new_tokens - 1) * 1e3:.2f} ms/step)  peak "
            f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB",
            flush=True,
        )


def profile(model, timed, prompts: list[list[int]], new_tokens: int) -> None:
    """One more run under the profiler: GPU kernel time against the run's wall time (a decode
    loop whose GPU idles waits on the host's launches), and the top kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        timed(model, prompts, new_tokens)
        wall = time.perf_counter() - start
    events = prof.key_averages()
    kernels = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA)
    kernels /= 1e6  # the aten ops carry their kernels' time too: summed once, as kernels
    print(f"profiled run: wall {wall * 1e3:.1f} ms, GPU kernels {kernels * 1e3:.1f} ms")
    print(events.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flavor", default="1B")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--impl", choices=["ours", "hf", "both"], default="both")
    p.add_argument("--batch", type=int, default=1, help="prompts decoded together")
    p.add_argument("--sdpa", choices=["default", *BACKENDS], default="default")
    p.add_argument("--profile", action="store_true", help="profile one more run of ours")
    p.add_argument("--eager", action="store_true", help="ours without the CUDA graph")
    a = p.parse_args()
    context = a.prompt_tokens + a.new_tokens
    gen = torch.Generator().manual_seed(0)
    vocab = get_model_args(a.flavor).vocab_size
    prompts = torch.randint(vocab, (a.batch, a.prompt_tokens), generator=gen).tolist()
    print(
        f"{torch.cuda.get_device_name()}; {a.flavor}, batch {a.batch}, prompt {a.prompt_tokens}, "
        f"{a.new_tokens} new; attention {a.sdpa}"
    )
    if a.sdpa != "default":
        sdpa_kernel(BACKENDS[a.sdpa]).__enter__()  # for the rest of the process
    if a.impl in ("ours", "both"):
        model = random_ours(a.flavor, context)
        name = "ours, eager" if a.eager else "ours"
        timed = functools.partial(timed_ours, graph=not a.eager)
        measure(name, model, timed, prompts, a.new_tokens, a.repeats)
        if a.profile:
            profile(model, timed, prompts, a.new_tokens)
        del model
        torch.cuda.empty_cache()
    if a.impl in ("hf", "both"):
        import transformers

        model = random_hf(a.flavor, context)
        name = f"transformers {transformers.__version__}"
        measure(name, model, timed_hf, prompts, a.new_tokens, a.repeats)


if __name__ == "__main__":
    main()
