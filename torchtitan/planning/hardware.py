"""The hardware a plan is made for: a card from a built-in table (or custom numbers) x GPUs x nodes.

Bandwidths are per GPU and per direction, in GB/s (10^9 bytes/s): ``nvlink_gbps`` between GPUs
of one node, ``network_gbps`` to other nodes (e.g. 400 Gb/s InfiniBand per GPU = 50 GB/s).
``hbm_gbps`` is the card's memory bandwidth (it bounds the optimizer step).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

GIB = 2**30


class HardwareError(ValueError):
    """A bad hardware argument; the message is one actionable line."""


@dataclass(frozen=True)
class Card:
    name: str
    memory_gib: float  # what torch.cuda.get_device_properties reports, in GiB
    tflops: float  # dense bf16 peak
    nvlink_gbps: float
    network_gbps: float
    hbm_gbps: float


# Datasheet numbers (SXM parts). Memory: the usable size the driver reports, not the marketing GB.
CARDS: dict[str, Card] = {
    "H100": Card("H100", 79.6, 989.0, 450.0, 50.0, 3350.0),
    "H200": Card("H200", 140.4, 989.0, 450.0, 50.0, 4800.0),
    "H20": Card("H20", 95.0, 148.0, 450.0, 50.0, 4000.0),
    "A100": Card("A100", 79.2, 312.0, 300.0, 25.0, 2039.0),
    "A100-40GB": Card("A100-40GB", 39.4, 312.0, 300.0, 25.0, 1555.0),
    "B200": Card("B200", 178.4, 2250.0, 900.0, 50.0, 8000.0),
    "L40S": Card("L40S", 44.4, 362.0, 32.0, 12.5, 864.0),
}


@dataclass(frozen=True)
class Hardware:
    card: Card
    gpus_per_node: int
    nodes: int = 1

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def memory_bytes(self) -> float:
        return self.card.memory_gib * GIB

    def link_gbps(self, group_size: int, stride: int) -> float:
        """Per-GPU bandwidth of a collective over ``group_size`` ranks spaced ``stride`` apart in
        the rank order (the mesh's inner dimensions have stride 1): NVLink if the group fits in
        one node, else the network."""
        span = (group_size - 1) * stride + 1
        return self.card.nvlink_gbps if span <= self.gpus_per_node else self.card.network_gbps


def find_card(name: str) -> Card:
    for key, card in CARDS.items():
        if key.lower() == name.lower():
            return card
    raise HardwareError(
        f"unknown card '{name}'; choose one of {', '.join(CARDS)} or give --memory-gib, "
        "--tflops, --nvlink-gbps and --network-gbps"
    )


def make_hardware(
    gpus: int,
    nodes: int = 1,
    card: str | None = None,
    **custom: float | None,
) -> Hardware:
    """A Hardware from the table (``card``) with any of Card's numbers replaced by ``custom``
    (memory_gib, tflops, nvlink_gbps, network_gbps, hbm_gbps); without ``card`` all four of
    memory, TFLOP/s, NVLink and network must be given."""
    if gpus < 1 or nodes < 1:
        raise HardwareError(f"--gpus and --nodes must be positive; got {gpus} and {nodes}")
    given = {k: v for k, v in custom.items() if v is not None}
    for key, value in given.items():
        if value <= 0:
            raise HardwareError(f"--{key.replace('_', '-')} must be positive; got {value}")
    if card is None:
        needed = ("memory_gib", "tflops", "nvlink_gbps", "network_gbps")
        missing = [k for k in needed if k not in given]
        if missing:
            flags = ", ".join("--" + k.replace("_", "-") for k in missing)
            raise HardwareError(f"give --card ({', '.join(CARDS)}) or the custom card's {flags}")
        base = Card("custom", 0.0, 0.0, 0.0, 0.0, 3000.0)
    else:
        base = find_card(card)
    name = base.name if not given or card is None else f"{base.name}*"
    return Hardware(dataclasses.replace(base, name=name, **given), gpus, nodes)


def card_for_device_name(device_name: str) -> Card | None:
    """The table's card whose name appears in ``torch.cuda.get_device_name()``, if any."""
    for key, card in CARDS.items():
        if "-" not in key and key in device_name:
            return card
    return None
