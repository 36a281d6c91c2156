"""Segment-everything (automatic mask generation) parity: matching, goldens and the check.

The point-prompt gate compares one mask per annotation. A mask generator returns a set of masks
whose size may change between stages (a mask splits in two, one drops under a threshold), so
this gate matches the two sets one to one before comparing anything (parity.tasks.amg.matching).
"""
