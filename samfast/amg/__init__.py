"""Segment everything: samfast's SamAutomaticMaskGenerator (segment_anything's API, on the device)."""

from samfast.amg.generator import SamAutomaticMaskGenerator

__all__ = ["SamAutomaticMaskGenerator"]
