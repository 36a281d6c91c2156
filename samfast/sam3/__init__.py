"""SAM 3 (Segment Anything with Concepts) on samfast's stack."""
