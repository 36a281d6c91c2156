"""The embedded default AMG checks; it imports nothing, so the noxfile reads it without loading torch."""

# Each check holds enough masks that one mask the near-a-decision rule cannot place (a union IoU of 0) leaves
# its bf16 stages above their 0.97 union mean: with n masks matched at about 0.998 that needs n >= 36, and
# each holds more (39 and 54), so that it takes two such masks to decide its verdict (docs/amg-gate.md,
# which also gives their cost on 2 cores).

# The embedded default of `nox -s parity` (parity.gate), `nox -s golden` and the GPU test: the trained
# vit_tiny on 8 generated scenes, an 8x8 grid. The tiny model's scores run lower than real SAM's, so the
# filters are relaxed (0.8 / 0.9): 39 masks (11, 5, 3, 5, 4, 5, 3, 3; a 4x4 grid found 2.3 a scene).
# The CPU check runs fp32 and fp32+sdpa.
EMBEDDED_GOLDEN = ["--task", "amg", "--model", "vit_tiny", "--checkpoint", "trained", "--data", "scenes",
                   "--limit", "8", "--points-per-side", "8", "--pred-iou-thresh", "0.8", "--stability-score-thresh", "0.9"]
EMBEDDED = [*EMBEDDED_GOLDEN, "--stages", "fp32", "fp32+sdpa"]

# The same for SAM 2 (`check-sam2-amg`): the trained sam2.1_hiera_nano on 6 generated scenes, an 8x8 grid,
# filters 0.72 / 0.71: 54 masks (12, 10, 9, 6, 9, 8). On a GPU every default GPU stage runs against the CPU
# golden; on the CPU fp32 and fp32+sdpa.
EMBEDDED_SAM2_GOLDEN = ["--task", "amg", "--model", "sam2.1_hiera_nano", "--checkpoint", "trained", "--data", "scenes",
                        "--limit", "6", "--points-per-side", "8", "--pred-iou-thresh", "0.72",
                        "--stability-score-thresh", "0.71"]
EMBEDDED_SAM2 = [*EMBEDDED_SAM2_GOLDEN, "--stages", "fp32", "fp32+sdpa"]  # on the CPU; on a GPU the golden's arguments alone
