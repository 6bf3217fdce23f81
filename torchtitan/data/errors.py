"""The data package's user error (its own module, so that every data module can raise it)."""


class DataError(ValueError):
    """A dataset that cannot be used; the message is one line."""
