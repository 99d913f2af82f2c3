"""One conformance suite for every implementation of the network seam (see harness.py)."""
