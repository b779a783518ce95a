"""Pairwise masking for secure aggregation (docs/secure-aggregation.md), protocol-free.

Each pair of parties agrees on a secret (X25519, :mod:`secure.masking.keys`), from which every
slot of a session (pass, layer, part) gets its own seed and mask stream, uniform modulo the BFV
plaintext modulus (:mod:`secure.masking.streams`); the lower-indexed party of a pair adds the
stream and the higher subtracts it, so the masks cancel exactly in the sum. Shares are integers
on the share grid in BFV batching (:mod:`secure.masking.bfv`). A pass is masked over its
participants as the service states them, checked by each worker
(:mod:`secure.masking.participants`); a pass that loses one is void and redone, never recovered,
so no seed ever leaves a worker. The codec of sessions is :mod:`secure.masking.codec`.
"""
