"""Build the stateful data loader that yields ``(input_ids, labels)`` batches of shape [B, T]."""

import warnings

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from torchtitan.data.text import TextDataset, resolve_source
from torchtitan.data.tokenizer import Tokenizer

# torchdata 0.11 calls a deprecated torch API every time an iterator is created.
warnings.filterwarnings("ignore", message="'set_vital' is deprecated")


def stack_samples(
    samples: list[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, labels = zip(*samples)
    return torch.stack(inputs), torch.stack(labels)


def build_dataloader(
    dataset_spec: str,
    tokenizer: Tokenizer,
    seq_len: int,
    local_batch_size: int,
    dp_rank: int,
    dp_world_size: int,
    infinite: bool = True,
    text_field: str = "text",
) -> StatefulDataLoader:
    """Loader over this rank's share of the packed token windows.

    Its ``state_dict()`` is the dataset's global stream position (identical on every rank), so
    ``load_state_dict()`` resumes at exactly the next batch, even with another ``dp_world_size``
    as long as the global batch size is unchanged.
    """
    source = resolve_source(dataset_spec, text_field)
    dataset = TextDataset(source, tokenizer, seq_len, dp_rank, dp_world_size, infinite)
    # num_workers=0: no prefetching, so the dataset state is exactly "after the last batch".
    return StatefulDataLoader(
        dataset,
        batch_size=local_batch_size,
        num_workers=0,
        collate_fn=stack_samples,
        drop_last=True,
    )
