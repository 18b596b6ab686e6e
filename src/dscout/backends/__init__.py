"""Serving backends of the cluster path (SGLang)."""
