"""SAM 2's video memory: the memory encoder and memory attention (sam2.modeling.memory_*).

Built with the image model because they are part of every official checkpoint (which loads
strictly); the image path never calls them, the video predictor will.
"""
