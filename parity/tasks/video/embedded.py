"""The embedded default video check; it imports nothing, like the other tasks' embedded.py."""

# The embedded default of `nox -s parity` (parity.gate, the check-video step) and `nox -s golden`: the trained
# sam2.1_hiera_nano (its video modules trained on generated clips) on one generated clip of 6 frames at
# input size 256 (runner.VideoSpec's defaults), its golden made on the CPU. Without a GPU the check runs
# fp32 and fp32+sdpa, 4-6 s a stage and 20-36 s the whole step on 2 cores (docs/video-gate.md, "In the
# gate"); with one every stage built for tracking (runner.default_stages).
EMBEDDED_GOLDEN = ["--task", "video", "--model", "sam2.1_hiera_nano", "--checkpoint", "trained", "--data", "scenes"]
EMBEDDED = [*EMBEDDED_GOLDEN, "--stages", "fp32", "fp32+sdpa"]
