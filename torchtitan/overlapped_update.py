"""The optimizer's update overlapped with the next step's forward (``--optimizer.overlap_forward``).

Why: the update is memory-bound and, run at the end of a step, nothing overlaps it. In a trace
of 8B FSDP4 on 4x H200 the fused AdamW kernels were ~45 ms of the ~900 ms step on the compute
stream, with every other stream idle (docs/performance.md, finding 13).

How: the update runs on a side CUDA stream, one *unit* at a time in forward order (a unit is
what FSDP gathers together: the embeddings, each block, the final norm and head). An event
after each unit's update is waited for right before that unit's next forward: by FSDP's
all-gather streams, which read the sharded weights, and by the current stream. So the forward
of block 0 starts as soon as the embeddings and block 0 are updated, and the updates of later
blocks run under it.

The arithmetic is the optimizer's own: its ``step`` runs once per unit, restricted to the unit's
parameters (each parameter's update depends only on its own gradient, state and the shared
``grad_scale``/``found_inf``), so weights and optimizer state are bitwise those of one ``step``,
and checkpoints and hyperparameters are unchanged. Before anything else reads the weights (a
checkpoint, validation, the end of training) the trainer calls ``flush()``.

Float8 with precomputed scales: the scales come from the updated weights, so each unit's are
computed in its pre-forward hook, after the wait, on the stream that all-gathers it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from torchtitan.parallel.blocks import block_items


@dataclass
class Unit:
    """Parameters updated together, and the modules whose forward first reads them."""

    modules: list[nn.Module]
    params: list[nn.Parameter]
    ids: set[int] = field(default_factory=set)

    def __post_init__(self):
        self.ids = {id(p) for p in self.params}

    def owners(self) -> nn.ModuleList:
        """The modules (under ``modules``) whose own parameters are all in this unit: what the
        float8 scales of this unit, and no other, are computed over."""
        found: dict[int, nn.Module] = {}
        for top in self.modules:
            for m in top.modules():
                own = list(m.parameters(recurse=False))
                if own and all(id(p) in self.ids for p in own):
                    found[id(m)] = m
        return nn.ModuleList(found.values())


def _present(model: nn.Module, names: Sequence[str]) -> list[nn.Module]:
    found = []
    for name in names:
        try:
            module = model.get_submodule(name)
        except AttributeError:  # absent, e.g. cut away by a pipeline split
            continue
        if module is not None:
            found.append(module)
    return found


def forward_units(
    part: nn.Module,
    blocks_attr: str = "layers",
    input_group: Sequence[str] = ("tok_embeddings",),
    output_group: Sequence[str] = ("norm", "output"),
) -> list[Unit]:
    """``part``'s parameters in the groups FSDP shards them in (``parallel/fsdp.py``), in forward
    order. Parameters in no group form a first unit, waited for at ``part``'s own forward."""
    seen: set[int] = set()

    def unit(modules: list[nn.Module]) -> Unit:
        params = [p for m in modules for p in m.parameters() if id(p) not in seen]
        seen.update(id(p) for p in params)
        return Unit(modules, params)

    grouped = [unit(_present(part, input_group))]
    grouped += [unit([block]) for _, block in block_items(part, blocks_attr)]
    grouped.append(unit(_present(part, output_group)))
    rest = unit([part])
    return [u for u in [rest, *grouped] if u.params]


@contextlib.contextmanager
def only(optimizer: torch.optim.Optimizer, unit: Unit):
    """``optimizer`` sees only ``unit``'s parameters (its groups keep their order and
    hyperparameters; state is keyed by parameter, so it is untouched)."""
    saved = [group["params"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["params"] = [p for p in group["params"] if id(p) in unit.ids]
    try:
        yield
    finally:
        for group, params in zip(optimizer.param_groups, saved):
            group["params"] = params


def has_state(optimizer: torch.optim.Optimizer) -> bool:
    """Whether every parameter with a gradient has optimizer state already. The first update
    creates it; that one runs on the current stream, so the state lives in its memory pool."""
    return all(
        p in optimizer.state and len(optimizer.state[p]) > 0
        for group in optimizer.param_groups
        for p in group["params"]
        if p.grad is not None
    )


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _gather_streams(module: nn.Module) -> list[torch.cuda.Stream]:
    """FSDP2's all-gather streams, which read ``module``'s sharded weights in forward (none
    before FSDP's lazy init, or without FSDP)."""
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None:
        return []
    ctx = getattr(get_state(), "_comm_ctx", None)
    names = ("all_gather_copy_in_stream", "all_gather_stream")
    return [getattr(ctx, n) for n in names if getattr(ctx, n, None) is not None]


class OverlappedUpdate:
    """Runs the optimizers' updates on a side stream, unit by unit; see the module docstring.

    ``units_per_part[i]`` are the units of the model part that ``optimizers[i]`` updates.
    ``precompute_scales(module)``: sets the float8 scales of the weights under ``module`` (None:
    no precomputed scales); called per unit, right before its forward, once its update is done.
    """

    def __init__(
        self,
        units_per_part: Sequence[Sequence[Unit]],
        optimizers: Sequence[torch.optim.Optimizer],
        precompute_scales: Callable[[nn.Module], None] | None = None,
        device: torch.device | None = None,
    ):
        self.parts = list(zip(units_per_part, optimizers, strict=True))
        self.precompute_scales = precompute_scales
        # Off CUDA there are no streams: the units update one after another at ``step`` (same
        # order, same hooks), which is what the CPU tests check.
        cuda = (device or torch.device("cuda")).type == "cuda"
        self.stream = torch.cuda.Stream() if cuda else None
        self._events: dict[int, torch.cuda.Event | None] = {}
        for units, _ in self.parts:
            for unit in units:
                for module in unit.modules:
                    module.register_forward_pre_hook(self._hook(id(unit)), prepend=True)
        self._units = {id(u): u for units, _ in self.parts for u in units}
        self._owners = {i: u.owners() for i, u in self._units.items()} if precompute_scales else {}

    @property
    def pending(self) -> bool:
        """Whether some unit's update has not been waited for yet."""
        return bool(self._events)

    def ready(self) -> bool:
        """Whether the next update can run on the side stream (see ``has_state``)."""
        return all(has_state(optimizer) for _, optimizer in self.parts)

    def step(self) -> None:
        """Queue every optimizer's update on the side stream, unit by unit, after all the work
        queued so far on the current stream (backward, gradient clipping)."""
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream())
        with self._on(self.stream):
            for units, optimizer in self.parts:
                for unit in units:
                    with only(optimizer, unit):
                        optimizer.step()
                    self._events[id(unit)] = self._record()
        if self.stream is not None:
            self._keep_inputs_alive()

    @staticmethod
    def _on(stream: torch.cuda.Stream | None):
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def _record(self) -> torch.cuda.Event | None:
        if self.stream is None:
            return None
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def _keep_inputs_alive(self) -> None:
        """The trainer drops the gradients (and replaces ``grad_scale``/``found_inf``) right
        after ``step`` returns; their memory must not be reused before the side stream has read
        them."""
        for _, optimizer in self.parts:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        _local(p.grad).record_stream(self.stream)
            for name in ("grad_scale", "found_inf"):
                value = getattr(optimizer, name, None)
                if isinstance(value, torch.Tensor) and value.is_cuda:
                    value.record_stream(self.stream)

    def _hook(self, unit_id: int):
        def wait_for_update(module, args):
            if unit_id not in self._events:
                return
            event = self._events.pop(unit_id)
            scales_stream = None
            if event is not None:
                gather = _gather_streams(module)
                for stream in [torch.cuda.current_stream(), *gather]:
                    stream.wait_event(event)
                # The stream whose all-gather reads the scales (FSDP casts the weights there).
                scales_stream = gather[0] if gather else None
            if self.precompute_scales is not None:
                with self._on(scales_stream):
                    self.precompute_scales(self._owners[unit_id])

        return wait_for_update

    def flush(self) -> None:
        """Make the current stream wait for every queued update (and compute the float8 scales
        of the units not yet waited for), before something else reads weights or state."""
        if not self._events:
            return
        if self.stream is not None:
            torch.cuda.current_stream().wait_stream(self.stream)
        waiting = list(self._events)
        self._events.clear()
        if self.precompute_scales is not None:
            self.precompute_scales(nn.ModuleList(self._owners[i] for i in waiting))
