"""Concurrency on one machine: the batched draft-verify engine behind Table 4 on the CPU."""
