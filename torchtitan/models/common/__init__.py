"""What every model family shares: its declaration (``ModelFamily``)."""

from torchtitan.models.common.family import ModelFamily

__all__ = ["ModelFamily"]
