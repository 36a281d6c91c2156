"""The video task's golden: per clip, object and frame the fp32 mask (RLE) and object score logit, and
the video-resolution logits of a bounded subset of frames, in the golden store (parity/golden/store.py).

A folder holds manifest.json, tracks.json.gz ({"clips": [{"video_id", "frames", "height", "width",
"object_ids", "masks": [[RLE per frame] per object], "object_scores": [[float per frame] per object]}]})
and logits.npz (per clip `frames_<id>` (K,) and `logits_<id>` (K, objects, H, W) fp16). Bytes are
reproducible (parity.golden.manifest's gzip_json and npz); read() refuses what encode() would not write.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import math
import zipfile
import zlib
from pathlib import Path

import numpy as np

from parity.golden import manifest as golden_io
from parity.golden import store
from parity.golden.rle import decode_rle, encode_rle
from parity.tasks.video.produce import ClipOutputs

MARKER = "video"
TRACKS, LOGITS = "tracks.json.gz", "logits.npz"
CONTENT_FILES = (TRACKS, LOGITS)
FORMAT_VERSION = 1


def encode(outputs: list[ClipOutputs]) -> dict[str, bytes]:
    clips, arrays = [], {}
    for out in outputs:
        num_objects, num_frames, height, width = out.masks.shape
        clips.append({
            "video_id": out.video_id, "frames": num_frames, "height": height, "width": width,
            "object_ids": list(range(1, num_objects + 1)),
            "masks": [[encode_rle(out.masks[o, t]) for t in range(num_frames)] for o in range(num_objects)],
            # NaN (no output on a frame) is written as null: JSON has no NaN
            "object_scores": [[None if math.isnan(s) else float(s) for s in row] for row in out.object_scores.tolist()],
        })
        frames = sorted(out.logits)
        arrays[f"frames_{out.video_id}"] = np.array(frames, dtype=np.int64)
        arrays[f"logits_{out.video_id}"] = np.stack([out.logits[t] for t in frames]).astype(np.float16)
    return {TRACKS: golden_io.gzip_json({"clips": clips}), LOGITS: golden_io.npz(arrays)}


def publish(folder: Path, outputs: list[ClipOutputs], manifest: dict) -> Path:
    manifest = {**manifest, "task": MARKER, "format_version": FORMAT_VERSION, "clips": len(outputs)}
    return store.publish(folder, encode(outputs), manifest)


def read(folder: Path, regenerate: str) -> tuple[dict, list[ClipOutputs]]:
    """The manifest and the clips' outputs, every byte verified by the store and every record checked here."""
    folder = Path(folder)
    manifest, files = store.read(folder, regenerate)
    if manifest.get("task") != MARKER or manifest.get("format_version") != FORMAT_VERSION:
        raise golden_io.GoldenMismatch(
            f"golden {folder} is not a video golden of format {FORMAT_VERSION} (task={manifest.get('task')!r}, "
            f"format_version={manifest.get('format_version')!r}). Regenerate it with:\n  {regenerate}")
    missing = sorted(set(golden_io.IDENTITY_FIELDS) - set(manifest))
    if missing:
        raise store.corrupt(folder, store.MANIFEST, f"lacks {', '.join(missing)}", regenerate)
    try:
        clips = json.loads(gzip.decompress(files[TRACKS]))["clips"]
        with np.load(io.BytesIO(files[LOGITS]), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile, zlib.error, lzma.LZMAError) as err:
        raise store.corrupt(folder, TRACKS, f"or {LOGITS} cannot be read ({type(err).__name__}: {err})", regenerate) from None
    outputs = []
    for clip in clips:
        try:
            outputs.append(_decode_clip(clip, arrays))
        except (KeyError, TypeError, ValueError) as err:
            raise store.corrupt(folder, TRACKS, f"holds a clip record that is not one encode() writes ({err})",
                                regenerate) from None
    if not outputs or len(outputs) != manifest.get("clips"):
        raise store.corrupt(folder, TRACKS, f"holds {len(outputs)} clips, the manifest says {manifest.get('clips')!r}", regenerate)
    return manifest, outputs


def _decode_clip(clip: dict, arrays: dict[str, np.ndarray]) -> ClipOutputs:
    video_id, shape = clip["video_id"], (clip["frames"], clip["height"], clip["width"])
    masks = np.stack([np.stack([decode_rle(r) for r in row]) for row in clip["masks"]])
    if masks.shape[1:] != shape or len(clip["object_scores"]) != len(masks):
        raise ValueError(f"clip {video_id}: masks {masks.shape} do not match frames x height x width {shape}")
    scores = np.array([[math.nan if s is None else s for s in row] for row in clip["object_scores"]], dtype=np.float32)
    frames, logits = arrays[f"frames_{video_id}"], arrays[f"logits_{video_id}"]
    if logits.shape != (len(frames), len(masks), *shape[1:]):
        raise ValueError(f"clip {video_id}: logits {logits.shape} for {len(frames)} frames of {len(masks)} objects")
    return ClipOutputs(video_id, masks, scores, {int(t): l.astype(np.float32) for t, l in zip(frames, logits)})
