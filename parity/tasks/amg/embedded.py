"""The embedded default AMG check; it imports nothing, so the noxfile reads it without loading torch."""

# The embedded default of `nox -s parity` (parity.gate), `nox -s golden` and the GPU test: the trained
# vit_tiny on 3 generated scenes, a 4x4 grid. The tiny model's scores run lower than real SAM's, so the
# filters are relaxed (0.8 / 0.9) to keep 7 masks, none within 0.02 of a filter threshold; the CPU
# check runs fp32 and fp32+sdpa, about 6 s per image per stage on 2 cores (docs/amg-gate.md).
EMBEDDED_GOLDEN = ["--task", "amg", "--model", "vit_tiny", "--checkpoint", "trained", "--data", "scenes",
                   "--limit", "3", "--points-per-side", "4", "--pred-iou-thresh", "0.8", "--stability-score-thresh", "0.9"]
EMBEDDED = [*EMBEDDED_GOLDEN, "--stages", "fp32", "fp32+sdpa"]
