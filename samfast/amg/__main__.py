"""Segment everything in an image or a folder of images, like segment_anything's scripts/amg.py.

    python -m samfast.amg --model vit_tiny --checkpoint trained --input IMAGE_OR_DIR --output DIR
                          [--stages nt] [--convert-to-rle] [--points-per-side 32] [--overwrite]

Per image: DIR/<name>/ with one PNG per mask (0.png, 1.png, ...) and metadata.csv (the reference's
layout), or with --convert-to-rle DIR/<name>.json holding the records with COCO RLE masks.
Exit codes: 0 done; 2 bad input (a missing or unreadable image, an empty folder, two images of one
name, an output folder that already exists, a bad device, checkpoint or stage), with one line saying
what and how to fix it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from samfast import InputError
from samfast.transforms import read_image

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}
METADATA_HEADER = (
    "id,area,bbox_x0,bbox_y0,bbox_w,bbox_h,point_input_x,point_input_y,predicted_iou,"
    "stability_score,crop_box_x0,crop_box_y0,crop_box_w,crop_box_h"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m samfast.amg", description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, type=Path, help="an image, or a folder of images")
    parser.add_argument("--output", required=True, type=Path, help="a folder this command creates")
    parser.add_argument("--model", default="vit_h", help="a model type of any family: vit_tiny, vit_b, vit_l, vit_h (SAM 1), sam2.1_hiera_t ... (SAM 2) (default vit_h)")
    parser.add_argument("--checkpoint", help="official sam_vit_*.pth, a state dict in that layout, or 'trained'; seeded synthetic weights when omitted")
    parser.add_argument("--stages", default="fp32", help="a ladder stage or switches joined by '+' (default fp32)")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--convert-to-rle", action="store_true", help="one COCO RLE json per image instead of PNG masks")
    parser.add_argument("--overwrite", action="store_true", help="write into --output even if it exists")
    parser.add_argument("--points-per-side", type=int, default=32)
    parser.add_argument("--points-per-batch", type=int, help="points per decoder call (default: as many as fit)")
    parser.add_argument("--pred-iou-thresh", type=float, default=0.88)
    parser.add_argument("--stability-score-thresh", type=float, default=0.95)
    parser.add_argument("--stability-score-offset", type=float, default=1.0)
    parser.add_argument("--box-nms-thresh", type=float, default=0.7)
    parser.add_argument("--crop-n-layers", type=int, default=0)
    parser.add_argument("--crop-nms-thresh", type=float, default=0.7)
    parser.add_argument("--crop-overlap-ratio", type=float, default=512 / 1500)
    parser.add_argument("--crop-n-points-downscale-factor", type=int, default=1)
    parser.add_argument("--min-mask-region-area", type=int, default=0,
                        help="fill holes and remove islands smaller than this many pixels (default 0: off)")
    return parser.parse_args(argv)


def find_images(path: Path) -> list[Path]:
    if not path.exists():
        raise InputError(f"--input {path} does not exist: pass an image file or a folder of images")
    if path.is_file():
        return [path]
    images = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise InputError(f"--input folder {path} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}): point it at a folder with images")
    # Outputs are named by stem (<stem>/ or <stem>.json): a.jpg and a.png would overwrite each other.
    by_stem: dict[str, Path] = {}
    for image in images:
        if image.stem in by_stem:
            raise InputError(f"--input folder {path} holds {by_stem[image.stem].name} and {image.name}, whose "
                             f"outputs would both be named {image.stem!r}: rename or remove one of them")
        by_stem[image.stem] = image
    return images


def check_device(device: str | None) -> None:
    import torch

    if device is None:
        return
    try:
        parsed = torch.device(device)
    except RuntimeError as err:
        raise InputError(f"--device {device!r} is not a device ({err}): use cuda, cuda:N or cpu") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {device}: no CUDA GPU is available here; use --device cpu")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise InputError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA GPU(s), "
                         f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")


def check_output(path: Path, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise InputError(f"--output {path} already exists: choose a new folder, or pass --overwrite to write into it")


def write_masks(records: list[dict], folder: Path) -> None:
    """The reference's layout: <i>.png (0/255) per mask and metadata.csv with one row per mask."""
    folder.mkdir(exist_ok=True)
    lines = [METADATA_HEADER]
    for i, r in enumerate(records):
        Image.fromarray(r["segmentation"].astype(np.uint8) * 255).save(folder / f"{i}.png")
        values = [i, r["area"], *r["bbox"], *r["point_coords"][0], r["predicted_iou"], r["stability_score"], *r["crop_box"]]
        lines.append(",".join(str(v) for v in values))
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        images = find_images(args.input)
        check_device(args.device)
        check_output(args.output, args.overwrite)  # before the model is built: a mistake costs no wait
        generator = build_generator(args)
        args.output.mkdir(parents=True, exist_ok=True)
        for path in tqdm(images, desc="segment everything", unit="image"):
            records = generator.generate(read_image(path))
            if args.convert_to_rle:
                (args.output / f"{path.stem}.json").write_text(json.dumps(records))
            else:
                write_masks(records, args.output / path.stem)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def build_generator(args: argparse.Namespace):
    import samfast
    from samfast import CheckpointError, StageError
    from samfast.families import family_of

    try:
        family_of(args.model)
    except ValueError as err:
        raise InputError(f"--model: {err}") from None
    try:
        model = samfast.build_sam(args.model, args.checkpoint, device=args.device, stages=args.stages)
        return samfast.SamAutomaticMaskGenerator(
            model,
            points_per_side=args.points_per_side,
            points_per_batch=args.points_per_batch,
            pred_iou_thresh=args.pred_iou_thresh,
            stability_score_thresh=args.stability_score_thresh,
            stability_score_offset=args.stability_score_offset,
            box_nms_thresh=args.box_nms_thresh,
            crop_n_layers=args.crop_n_layers,
            crop_nms_thresh=args.crop_nms_thresh,
            crop_overlap_ratio=args.crop_overlap_ratio,
            crop_n_points_downscale_factor=args.crop_n_points_downscale_factor,
            min_mask_region_area=args.min_mask_region_area,
            output_mode="coco_rle" if args.convert_to_rle else "binary_mask",
        )
    except (CheckpointError, StageError) as err:  # bad input too (the generator's own checks raise InputError)
        raise InputError(str(err)) from err


if __name__ == "__main__":
    sys.exit(main())
