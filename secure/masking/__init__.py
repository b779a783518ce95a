"""Pairwise masking for secure aggregation (docs/secure-aggregation.md), protocol-free.

Each pair of parties agrees on a secret (X25519, :mod:`secure.masking.keys`), from which every
slot of a session (pass, layer, part) gets its own seed and mask stream, uniform modulo the BFV
plaintext modulus (:mod:`secure.masking.streams`); the lower-indexed party of a pair adds the
stream and the higher subtracts it, so the masks cancel exactly in the sum. Shares are integers
on the share grid in BFV batching (:mod:`secure.masking.bfv`). A party's slot seeds are
Shamir-shared to the others, so that the masks of a party that dropped out can be removed from
a sum, under the rule that keeps SecAgg's known attack out (:mod:`secure.masking.recovery`).

Nothing here talks to the service or the workers yet: these are the pure functions the protocol
will call.
"""
