"""Experiment logic built on the library: configuration searches (drafter depth)."""
