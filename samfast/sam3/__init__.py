"""SAM 3 (Segment Anything with Concepts) on samfast's stack: sam3 0.1.4's image model, equal to it in
fp32 (the ViT, text encoder, fusion encoder, DETR decoder with its presence token, geometry encoder, mask
head, and the tracker's heads for point and box prompts), under sam3's parameter names so that sam3.pt loads unchanged.

    model = samfast.build_sam("sam3", "sam3.pt")            # or seed=N for seeded weights
    processor = samfast.sam3.Sam3Processor(model)            # sam3's names and outputs
    state = processor.set_text_prompt("a dog", processor.set_image(image))

    results = processor.predict_batch(images, ["a dog", "a cat"])  # results[i][j]: image i, phrase j

    # points and boxes, as sam3's predict_inst (the model built with enable_inst_interactivity=True)
    masks, ious, low_res = model.predict_inst(state, point_coords=points, point_labels=labels)

or, as sam3 code does it, `build_sam3_image_model(checkpoint_path="sam3.pt", load_from_HF=False)`.
"""

from samfast.sam3.builder import build_sam3_image_model
from samfast.sam3.config import MODEL_TYPES
from samfast.sam3.family import SAM3
from samfast.sam3.processor import Sam3Processor

__all__ = ["MODEL_TYPES", "SAM3", "Sam3Processor", "build_sam3_image_model"]
