"""SAM 2's prompt encoder and mask decoder (sam2.modeling.sam), built on SAM 1's modules where they agree."""
