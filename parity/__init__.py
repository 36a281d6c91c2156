"""parity: the gate that checks every samfast optimization against stored fp32 goldens."""
