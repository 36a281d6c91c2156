"""The embedded default point checks; it imports nothing, so the noxfile reads it without loading torch.

`nox -s parity` (parity.gate) and `nox -s golden` run these: the trained vit_tiny on the 16 generated
scenes, and the project's small SAM 2 (the trained sam2.1_hiera_nano) on the same scenes.
"""

EMBEDDED = ["--model", "vit_tiny", "--checkpoint", "trained", "--data", "scenes"]
EMBEDDED_SAM2 = ["--model", "sam2.1_hiera_nano", "--checkpoint", "trained", "--data", "scenes"]
