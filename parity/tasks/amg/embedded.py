"""The embedded default AMG checks; it imports nothing, so the noxfile reads it without loading torch."""

# The embedded default of `nox -s parity` (parity.gate), `nox -s golden` and the GPU test: the trained
# vit_tiny on 3 generated scenes, a 4x4 grid. The tiny model's scores run lower than real SAM's, so the
# filters are relaxed (0.8 / 0.9) to keep 7 masks, none within 0.02 of a filter threshold; the CPU
# check runs fp32 and fp32+sdpa, about 6 s per image per stage on 2 cores (docs/amg-gate.md).
EMBEDDED_GOLDEN = ["--task", "amg", "--model", "vit_tiny", "--checkpoint", "trained", "--data", "scenes",
                   "--limit", "3", "--points-per-side", "4", "--pred-iou-thresh", "0.8", "--stability-score-thresh", "0.9"]
EMBEDDED = [*EMBEDDED_GOLDEN, "--stages", "fp32", "fp32+sdpa"]

# The same for SAM 2 (`check-sam2-amg`): the trained sam2.1_hiera_nano on 2 generated scenes, an 8x8
# grid. Filters 0.72 / 0.71 keep 22 masks (12 and 10), and every candidate mask sits more than 0.02 from
# both, as far as counts show: the golden keeps as many masks with each filter moved 0.02 either way
# (measured on 3 scenes, 31 masks at all five settings). On the CPU about 10 s per image per stage on 2
# cores. On a GPU every default GPU stage (docs/amg-gate.md): the bf16 stages
# passed in one H100 gate and found one more mask (union IoU 0.955 against 0.97) in another run (session
# 36), most likely at an NMS decision (two boxes at IoU 0.7061). The check now counts a mask near a filter
# or near box NMS instead of failing it, and pairs a golden mask with one the stage's NMS dropped at a
# near tie (swapped at NMS; scene 1 has such a pair, 0.917 / 0.918 at box IoU 0.84): parity.tasks.amg.
# matching and docs/amg-gate.md. Every default GPU stage passed twice on an H200 before those two rules
# (docs/measurements/amg/sam2-amg-parity-h200-nano-every-stage-2026-11-28-c27bb36.md).
EMBEDDED_SAM2_GOLDEN = ["--task", "amg", "--model", "sam2.1_hiera_nano", "--checkpoint", "trained", "--data", "scenes",
                        "--limit", "2", "--points-per-side", "8", "--pred-iou-thresh", "0.72",
                        "--stability-score-thresh", "0.71"]
EMBEDDED_SAM2 = [*EMBEDDED_SAM2_GOLDEN, "--stages", "fp32", "fp32+sdpa"]  # on the CPU; on a GPU the golden's arguments alone
