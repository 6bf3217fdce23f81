"""The data package's user errors (their own module, so that every data module can raise them)."""


class DataError(ValueError):
    """A dataset that cannot be used; the message is one line."""


class TokenizerError(ValueError):
    """A tokenizer file that is missing or malformed; the message is one line."""
