"""SAM 2's prompt path (sam2.modeling.sam, sam2.sam2_image_predictor, sam2.utils.transforms): the prompt
encoder, the mask decoder and its two-way transformer, built on SAM 1's modules where they agree, and the
image predictor that drives them. Shared: SAM 2 builds its model on them, and SAM 3's tracker has the same
heads (samfast.sam3.interactive)."""
