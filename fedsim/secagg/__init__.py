"""Secure aggregation: SecAgg+ (Bell et al. 2020) on Flower's Message API, carrying fedsim's discrete noise.

* :mod:`fedsim.secagg.crypto`: X25519 key agreement, AES-GCM, ChaCha20 masks exactly uniform modulo ``2^bits``,
  Shamir secret sharing;
* :mod:`fedsim.secagg.graph`: the round's neighbour graph and the rule that decides whether a round can be unmasked;
* :mod:`fedsim.secagg.protocol`: the server's four stages over a Grid (:func:`~fedsim.secagg.protocol.secure_sum`)
  and the client's side of each;
* :mod:`fedsim.secagg.simulated`: the same dropouts and aborts in a simulation, without the cryptography.

The threat model is in ``docs/secagg.md``.
"""
