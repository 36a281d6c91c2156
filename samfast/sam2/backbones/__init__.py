"""The image encoder of SAM 2: a Hiera trunk and an FPN neck (sam2.modeling.backbones)."""
