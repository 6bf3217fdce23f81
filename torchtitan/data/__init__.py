from torchtitan.data.loader import TextLoader, build_dataloader
from torchtitan.data.text import DataError, DatasetSource, TextDataset, resolve_source
from torchtitan.data.tokenizer import Tokenizer, TokenizerError

__all__ = [
    "DataError",
    "DatasetSource",
    "TextDataset",
    "TextLoader",
    "Tokenizer",
    "TokenizerError",
    "build_dataloader",
    "resolve_source",
]
