"""The SAM 1 family (segment_anything's ViT-B/L/H, plus the project's vit_tiny and vit_b_2block):
its hyper-parameters (config), ViT image encoder, the Sam module (sam), checkpoints and its record
in the family registry (family). The blocks it shares with other families live in samfast.modeling."""

from samfast.sam1.config import MODEL_TYPES
from samfast.sam1.family import SAM1
from samfast.sam1.sam import Sam

__all__ = ["MODEL_TYPES", "SAM1", "Sam"]
