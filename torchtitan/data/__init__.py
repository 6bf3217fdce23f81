from torchtitan.data.errors import DataError
from torchtitan.data.loader import TextLoader, build_dataloader
from torchtitan.data.sources import DatasetSource, resolve_source
from torchtitan.data.text import TextDataset
from torchtitan.data.tokenizer import JsonTokenizer, Tokenizer, TokenizerError, load_tokenizer

__all__ = [
    "DataError",
    "DatasetSource",
    "JsonTokenizer",
    "TextDataset",
    "TextLoader",
    "Tokenizer",
    "TokenizerError",
    "build_dataloader",
    "load_tokenizer",
    "resolve_source",
]
