"""Serving backends: SGLang (the cluster path), vLLM (its CPU build here, the official wheel on the cluster), and what
both share (:mod:`dscout.backends.server`)."""
