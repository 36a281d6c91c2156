"""The embedded default concept check; it imports nothing, like the other tasks' embedded.py.

`nox -s parity` (parity.gate, the check-concept step) and `nox -s golden` run it: the reduced SAM 3 with
seeded weights (no trained small SAM 3 is embedded yet, so its masks mean nothing and the check gates
numerics: the same queries kept, their masks, boxes, scores and presence) on 4 generated scenes, every
scene category's name as a phrase on every image. Seeded weights score every query near 0.25, so the
confidence threshold sits among them (--confidence-threshold) for the golden to hold detections on both
sides of it. On the CPU the check runs fp32 and fp32+sdpa; on a GPU every default stage SAM 3 builds.
"""

EMBEDDED_GOLDEN = ["--task", "concept", "--model", "sam3_reduced", "--seed", "0", "--data", "scenes", "--limit", "4",
                   "--confidence-threshold", "0.25"]
EMBEDDED = [*EMBEDDED_GOLDEN, "--stages", "fp32", "fp32+sdpa"]
