from torchtitan.data.errors import DataError
from torchtitan.data.loader import TextLoader, build_dataloader
from torchtitan.data.sources import DatasetSource, resolve_source
from torchtitan.data.text import TextDataset
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
