"""Cryptographic primitives of SecAgg+ (Bell, Bonawitz, Gascon, Lepoint and Raykova 2020).

What each primitive is for in the protocol (:mod:`fedsim.secagg.protocol`):

- :func:`key_pair` / :func:`agree`: every client publishes two X25519 public keys. One pair of keys gives each pair of
  graph neighbours the seed of their *pairwise mask* (one adds it, the other subtracts it, so it cancels in the sum);
  the other gives them the key that encrypts the shares they send each other through the server. The raw X25519
  output is not uniform bytes, so it goes through HKDF-SHA256 with an ``info`` string that separates the uses (mask
  seed vs. encryption key, and the session): the same key pair never yields the same key for two purposes.
- :func:`encrypt` / :func:`decrypt`: AES-256-GCM with a fresh random 96-bit nonce. The server relays the shares, so
  it must neither read them (confidentiality) nor swap or replay them between clients, rounds or stages
  (integrity, bound to the sender, receiver and session through the associated data).
- :func:`random_seed` / :func:`mask`: a client's *self mask* seed, and the expansion of any 256-bit seed into a mask
  vector uniform modulo ``2^bits``, the modulus of fedsim's encoded updates (:mod:`fedsim.round.discrete`).
- :func:`split` / :func:`combine`: Shamir t-of-n sharing of a client's self-mask seed and of its mask-agreement
  private key. For a client that replied the server collects shares of the self-mask seed and removes that mask; for
  a client that dropped it collects shares of the private key and recomputes the dropped client's pairwise masks.
  Never both for one client, which is what keeps an individual input hidden.

Why not Flower's legacy SecAgg+ helpers (``flwr.common.secure_aggregation``): its ``pseudo_rand_gen`` XOR-folds the
32-byte seed into a 32-bit integer to seed ``numpy.random.RandomState``, so a mask has at most 2^32 possible values
whatever the key exchange provides (an observer of the masked vector can enumerate them), and it draws
``randint(0, m - 1)``, whose upper bound is exclusive: the value ``m - 1`` never occurs, so masked values are not
uniform and leak information about the input. Here the full 256-bit seed keys ChaCha20, and the low ``bits`` bits of
each little-endian uint32 keystream word are exactly uniform on ``[0, 2^bits)`` because ``2^bits`` divides ``2^32``
(no rejection sampling, no modulo bias). Flower's encryption is Fernet (AES-128-CBC plus HMAC, base64 framing) with
no associated data and its key derivation has no ``info``; its Shamir sharing pads the secret and splits it in 16-byte
chunks over GF(2^128). Here one authenticated AEAD call binds the context, and a single polynomial over the Mersenne
prime ``2^521 - 1`` carries any secret up to 64 bytes (a 32-byte seed or X25519 key fits with room to spare) with its
length, so it comes back byte for byte, leading zeros included.

All refusals raise :class:`SecAggError` (a :class:`ValueError`) naming the bad value and what is allowed; secret
material is described by its type and length, never printed.
"""

from __future__ import annotations

import numbers
import os
import secrets

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "MAX_HOLDERS",
    "MAX_SECRET_BYTES",
    "PRIME",
    "SEED_BYTES",
    "SHARE_BYTES",
    "DecryptionError",
    "SecAggError",
    "agree",
    "combine",
    "decrypt",
    "encrypt",
    "key_pair",
    "mask",
    "public_of",
    "random_seed",
    "split",
]

SEED_BYTES = 32
"""Length of mask seeds, X25519 keys and derived symmetric keys (256 bits)."""

KEY_BYTES = 32
_NONCE_BYTES = (
    12  # AES-GCM's standard nonce: random 96-bit nonces are safe for far more than the few per key here
)
_TAG_BYTES = 16
_MAX_MASK_BITS = 32  # masks are read from uint32 keystream words
_CHUNK_BYTES = 1 << 16  # keystream bytes per cipher call in mask(): large enough that the loop costs nothing
_ZEROS = bytes(_CHUNK_BYTES)

PRIME = 2**521 - 1
"""Shamir's field GF(PRIME): a Mersenne prime, so any secret of up to 64 bytes plus a length marker is below it."""

MAX_SECRET_BYTES = 64
"""Longest secret :func:`split` shares: 64 bytes after a 0x01 marker byte is 520 bits, below PRIME."""

MAX_HOLDERS = 65535
"""Most shares of one secret: the x coordinate of a share is encoded in 2 bytes and x = 0 is the secret itself."""

_X_BYTES = 2
_Y_BYTES = (PRIME.bit_length() + 7) // 8  # 66
SHARE_BYTES = _X_BYTES + _Y_BYTES
"""Length of an encoded share: x (2 bytes, big endian) || y (66 bytes, big endian)."""


class SecAggError(ValueError):
    """A secure-aggregation refusal: malformed input to a primitive or to the protocol, with a clear message."""


class DecryptionError(SecAggError):
    """A ciphertext failed authentication (wrong key, altered bytes or associated data) or is too short."""


def _as_bytes(name: str, value: object, length: int | None = None) -> bytes:
    """``value`` as bytes, refusing other types and (if ``length`` is given) other lengths.

    The message names the type and length only: the value may be key or seed material.
    """
    if not isinstance(value, bytes | bytearray | memoryview):
        raise SecAggError(f"{name} must be bytes, got {type(value).__name__}")
    data = bytes(value)
    if length is not None and len(data) != length:
        raise SecAggError(f"{name} must be exactly {length} bytes, got {len(data)} bytes")
    return data


def _as_int(name: str, value: object) -> int:
    """``value`` as an int, refusing bools, floats and other non-integers (numpy integers are accepted)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SecAggError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    return int(value)


# ------------------------------------------------------------------------------------------------ key agreement


def key_pair() -> tuple[bytes, bytes]:
    """A fresh X25519 key pair from the OS's entropy, as raw bytes: ``(private (32 B), public (32 B))``."""
    private = X25519PrivateKey.generate()
    return private.private_bytes_raw(), private.public_key().public_bytes_raw()


def _private_key(private: bytes) -> X25519PrivateKey:
    data = _as_bytes("X25519 private key", private, KEY_BYTES)
    try:
        return X25519PrivateKey.from_private_bytes(data)
    except ValueError as exc:  # pragma: no cover - any 32 bytes is a valid (clamped) X25519 scalar
        raise SecAggError(f"invalid X25519 private key: {exc}") from exc


def public_of(private: bytes) -> bytes:
    """The raw X25519 public key of a raw private key (how a recovered private key is checked against its owner's)."""
    return _private_key(private).public_key().public_bytes_raw()


def agree(private: bytes, peer_public: bytes, info: bytes) -> bytes:
    """A 32-byte key shared with the owner of ``peer_public``: X25519, then HKDF-SHA256 with ``info``.

    Symmetric: ``agree(a_priv, b_pub, info) == agree(b_priv, a_pub, info)``. ``info`` separates the uses of one key
    pair (mask seed, share encryption) and binds the session, so the same two keys give unrelated outputs in other
    contexts. A peer key of low order (such as all zeros) makes the X25519 output all zero whatever the private key:
    a server forging public keys could then predict the "shared" key, so it is refused (cryptography raises
    ValueError for that output; it becomes a :class:`SecAggError` here).
    """
    key = _private_key(private)
    peer_bytes = _as_bytes("peer X25519 public key", peer_public, KEY_BYTES)
    context = _as_bytes("info", info)
    try:
        peer = X25519PublicKey.from_public_bytes(peer_bytes)
        shared = key.exchange(peer)
    except ValueError as exc:
        raise SecAggError(
            f"peer X25519 public key {peer_bytes.hex()} is of low order (the shared secret would be all zeros, "
            f"known to anyone); a public key from key_pair() is required ({exc})"
        ) from exc
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=context).derive(shared)


# ------------------------------------------------------------------------------------------- authenticated encryption


def encrypt(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """AES-256-GCM encryption under ``key`` (32 bytes): ``nonce (12 B) || ciphertext || tag (16 B)``.

    The nonce is fresh from the OS for every call, so two encryptions of one plaintext differ. ``associated`` is
    authenticated but not encrypted: it carries who sent what to whom in which session, so the relaying server
    cannot move a ciphertext to another context without :func:`decrypt` refusing it.
    """
    cipher = AESGCM(_as_bytes("encryption key", key, KEY_BYTES))
    nonce = os.urandom(_NONCE_BYTES)
    return nonce + cipher.encrypt(
        nonce, _as_bytes("plaintext", plaintext), _as_bytes("associated data", associated)
    )


def decrypt(key: bytes, ciphertext: bytes, associated: bytes) -> bytes:
    """The plaintext of :func:`encrypt`'s output; :class:`DecryptionError` if it does not authenticate.

    A wrong key, any altered byte of the nonce, ciphertext or tag, different ``associated`` data or an input shorter
    than a nonce plus a tag all give the same refusal (GCM cannot tell them apart, and need not).
    """
    cipher = AESGCM(_as_bytes("encryption key", key, KEY_BYTES))
    data = _as_bytes("ciphertext", ciphertext)
    context = _as_bytes("associated data", associated)
    if len(data) < _NONCE_BYTES + _TAG_BYTES:
        raise DecryptionError(
            f"ciphertext of {len(data)} bytes is shorter than a nonce and a tag "
            f"({_NONCE_BYTES + _TAG_BYTES} bytes): not an output of encrypt()"
        )
    try:
        return cipher.decrypt(data[:_NONCE_BYTES], data[_NONCE_BYTES:], context)
    except InvalidTag:
        raise DecryptionError(
            "ciphertext does not authenticate: wrong key, altered ciphertext or different associated data"
        ) from None


# ----------------------------------------------------------------------------------------------------------- masks


def random_seed() -> bytes:
    """A fresh 32-byte mask seed from the OS's entropy (a client's self-mask seed)."""
    return os.urandom(SEED_BYTES)


def mask(seed: bytes, size: int, bits: int) -> np.ndarray:
    """``size`` values uniform on ``[0, 2^bits)`` expanded from a 32-byte seed, dtype ``np.uint32``.

    The seed keys ChaCha20 (RFC 7539 layout in cryptography: 16-byte nonce = 32-bit counter || 96-bit nonce, here all
    zero: each seed masks one vector only, so no (key, nonce) pair is reused). The keystream is read as
    little-endian uint32 words and the low ``bits`` bits of each are kept: since ``2^bits`` divides ``2^32`` every
    residue has exactly ``2^(32 - bits)`` preimages, so the values are exactly uniform (given a random seed). The
    keystream is written into the result in 64 KiB chunks and masked by one vectorised AND: a million values take
    about two milliseconds.

    The protocol adds and subtracts masks modulo ``2^bits`` in wider (uint64) arrays; this function only draws them.
    """
    key = _as_bytes("mask seed", seed, SEED_BYTES)
    n = _as_int("mask size", size)
    if n < 0:
        raise SecAggError(f"mask size must be >= 0, got {n}")
    width = _as_int("mask bits", bits)
    if not 1 <= width <= _MAX_MASK_BITS:
        raise SecAggError(f"mask bits must be in 1..{_MAX_MASK_BITS}, got {width}")
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    words = np.empty(n, dtype="<u4")
    out = memoryview(words).cast("B")
    zeros = memoryview(_ZEROS)
    total = 4 * n
    # ChaCha20 of zeros is the keystream itself, written straight into the array a chunk at a time: a zero input as
    # long as the output would cost more in page faults than the cipher costs (about 3x slower at 2^20 values).
    for start in range(0, total, _CHUNK_BYTES):
        stop = min(start + _CHUNK_BYTES, total)
        encryptor.update_into(zeros[: stop - start], out[start:stop])
    if width < _MAX_MASK_BITS:
        words &= np.uint32((1 << width) - 1)
    return words.astype(np.uint32, copy=False)  # native byte order (no copy on little-endian machines)


# ------------------------------------------------------------------------------------------------ Shamir sharing


def _check_threshold(threshold: object, holders: int) -> int:
    t = _as_int("threshold", threshold)
    if not 1 <= t <= holders:
        raise SecAggError(f"threshold must satisfy 1 <= threshold <= holders = {holders}, got threshold {t}")
    return t


def split(secret: bytes, threshold: int, holders: int) -> list[bytes]:
    """Shamir ``threshold``-of-``holders`` shares of ``secret`` (at most 64 bytes), over GF(2^521 - 1).

    The secret, prefixed with a 0x01 byte so its length (leading zero bytes included) survives the integer
    encoding, is the constant term of a polynomial of degree ``threshold - 1`` whose other coefficients are uniform
    in the field (``secrets.randbelow``). Share ``i`` (0-based) is the polynomial at ``x = i + 1``, encoded as
    ``x (2 bytes big endian) || y (66 bytes big endian)``. Any ``threshold`` shares determine the secret; fewer are
    independent of it (for every candidate secret exactly one polynomial fits them).
    """
    data = _as_bytes("secret", secret)
    if len(data) > MAX_SECRET_BYTES:
        raise SecAggError(f"secret must be at most {MAX_SECRET_BYTES} bytes, got {len(data)} bytes")
    n = _as_int("holders", holders)
    if not 1 <= n <= MAX_HOLDERS:
        raise SecAggError(f"holders must be in 1..{MAX_HOLDERS}, got {n}")
    t = _check_threshold(threshold, n)
    coefficients = [int.from_bytes(b"\x01" + data, "big")]
    coefficients.extend(secrets.randbelow(PRIME) for _ in range(t - 1))
    highest_first = coefficients[::-1]
    shares = []
    for x in range(1, n + 1):
        y = 0
        for c in highest_first:  # Horner: t multiply-adds per holder
            y = (y * x + c) % PRIME
        shares.append(x.to_bytes(_X_BYTES, "big") + y.to_bytes(_Y_BYTES, "big"))
    return shares


def _decode_share(index: int, share: object) -> tuple[int, int]:
    data = _as_bytes(f"share {index}", share, SHARE_BYTES)
    x = int.from_bytes(data[:_X_BYTES], "big")
    y = int.from_bytes(data[_X_BYTES:], "big")
    if x == 0:
        raise SecAggError(f"share {index} has x = 0; shares have x in 1..{MAX_HOLDERS}")
    if y >= PRIME:
        raise SecAggError(f"share {index} has y >= 2^521 - 1, outside the field: not an output of split()")
    return x, y


def combine(shares: list[bytes], threshold: int) -> bytes:
    """The secret of :func:`split`, by Lagrange interpolation at 0 of the first ``threshold`` distinct shares.

    Shares are distinct by x; a repeated share is skipped, two different shares with one x are refused (they cannot
    come from one split). Fewer than ``threshold`` distinct shares are refused: interpolating them would give an
    unrelated value. Shares of different splits, or a forged share, interpolate to a field element that is almost
    never a valid encoding and then raise :class:`SecAggError`; when it happens to be one, the bytes returned are
    not the secret (nothing in Shamir sharing detects a wrong share; the protocol checks a recovered key against its
    owner's public key with :func:`public_of`).
    """
    if isinstance(shares, bytes | bytearray | memoryview | str) or not hasattr(shares, "__iter__"):
        raise SecAggError(f"shares must be a list of shares (bytes), got {type(shares).__name__}")
    t = _as_int("threshold", threshold)
    if not 1 <= t <= MAX_HOLDERS:
        raise SecAggError(f"threshold must be in 1..{MAX_HOLDERS}, got {t}")
    points: dict[int, int] = {}
    for index, share in enumerate(shares):
        x, y = _decode_share(index, share)
        known = points.get(x)
        if known is None:
            points[x] = y
        elif known != y:
            raise SecAggError(f"two different shares with x = {x} (share {index} and an earlier one)")
    if len(points) < t:
        raise SecAggError(
            f"{len(points)} distinct shares given, {t} needed (threshold {t}): too few to reconstruct the secret"
        )
    xs = list(points)[:t]
    value = 0
    for j, xj in enumerate(xs):
        numerator = 1
        denominator = 1
        for m, xm in enumerate(xs):
            if m != j:
                numerator = numerator * xm % PRIME
                denominator = denominator * (xm - xj) % PRIME
        value = (value + points[xj] * numerator * pow(denominator, -1, PRIME)) % PRIME
    length = (value.bit_length() - 1) // 8
    if value == 0 or value >> (8 * length) != 1 or length > MAX_SECRET_BYTES:
        raise SecAggError(
            "the shares do not interpolate to a secret encoded by split(): they come from different splits, "
            "one is forged or altered, or the threshold differs from the one used to split"
        )
    return (value - (1 << (8 * length))).to_bytes(length, "big")
