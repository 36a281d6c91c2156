"""tinysam: training of the small vit_tiny SAM that the gate embeds (samfast/weights/vit_tiny_trained.pt).

It sits above parity (bench -> tinysam -> parity -> samfast): training validates on the gate's own
data path, prompts and metrics (parity.golden.data, parity.tasks.point.produce, parity.compare.metrics) on its generated
scenes (parity.golden.scenes), so the checkpoint is measured the way the gate measures it.
"""
