"""tinysam: training of the small vit_tiny SAM that the gate embeds (samfast/weights/vit_tiny_trained.pt).

It sits above parity (bench -> tinysam -> parity -> samfast): training validates on the gate's own
data path, prompts and metrics (parity.data, parity.evaluate, parity.metrics) on its generated
scenes (parity.scenes), so the checkpoint is measured the way the gate measures it.
"""
