"""What every family's image input shares: the side of the square frame its image encoder takes."""

IMAGE_SIZE = 1024
