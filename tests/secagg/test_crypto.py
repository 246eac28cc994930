"""The SecAgg+ primitives (fedsim.secagg.crypto): masks cancel and are uniform, Shamir needs exactly the threshold,
AES-GCM authenticates its context, and key agreement refuses low-order keys.

Statistical tests use fixed seeds, so they are deterministic: a failure is a change in the mask construction, not bad
luck.
"""

from __future__ import annotations

import hashlib
import itertools
import random

import numpy as np
import pytest
from scipy import stats

from fedsim.secagg import crypto
from fedsim.secagg.crypto import DecryptionError, SecAggError

FIXED_SEEDS = [hashlib.sha256(b"fedsim secagg test seed %d" % i).digest() for i in range(4)]
SEED_IDS = [f"seed{i}" for i in range(len(FIXED_SEEDS))]


def _reconstructs(shares: list[bytes], threshold: int) -> bytes | None:
    """What combine() returns, or None when it refuses the interpolated value as no encoded secret."""
    try:
        return crypto.combine(shares, threshold)
    except SecAggError:
        return None


# ----------------------------------------------------------------------------------------------------- agreement


def test_agree_is_symmetric_and_separated_by_info():
    a_priv, a_pub = crypto.key_pair()
    b_priv, b_pub = crypto.key_pair()
    key = crypto.agree(a_priv, b_pub, b"mask|session-1")
    assert len(key) == crypto.SEED_BYTES
    assert key == crypto.agree(b_priv, a_pub, b"mask|session-1")
    assert key != crypto.agree(a_priv, b_pub, b"share|session-1")
    assert key != crypto.agree(a_priv, b_pub, b"mask|session-2")
    _, c_pub = crypto.key_pair()
    assert key != crypto.agree(a_priv, c_pub, b"mask|session-1")


def test_key_pair_is_fresh_and_public_of_matches():
    first, second = crypto.key_pair(), crypto.key_pair()
    assert first != second
    for private, public in (first, second):
        assert len(private) == len(public) == 32
        assert crypto.public_of(private) == public


@pytest.mark.parametrize(
    "peer_hex",
    [
        "00" * 32,  # the all-zero point
        "01" + "00" * 31,  # u = 1, a point of order 4
        "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",  # order 8
    ],
)
def test_agree_refuses_low_order_peer_keys(peer_hex):
    private, _ = crypto.key_pair()
    with pytest.raises(SecAggError, match="low order"):
        crypto.agree(private, bytes.fromhex(peer_hex), b"mask")


def test_agree_and_public_of_refuse_wrong_lengths():
    private, public = crypto.key_pair()
    with pytest.raises(SecAggError, match="peer X25519 public key must be exactly 32 bytes, got 31"):
        crypto.agree(private, public[:31], b"mask")
    with pytest.raises(SecAggError, match="private key must be exactly 32 bytes, got 33"):
        crypto.agree(private + b"\x00", public, b"mask")
    with pytest.raises(SecAggError, match="private key must be exactly 32 bytes, got 0"):
        crypto.public_of(b"")
    with pytest.raises(SecAggError, match="info must be bytes, got str"):
        crypto.agree(private, public, "mask")


# ---------------------------------------------------------------------------------------------------------- masks


@pytest.mark.parametrize("bits", [8, 16, 20, 32])
def test_pairwise_masks_cancel_in_the_modular_sum(bits):
    """Five parties mask their inputs with +/- the mask of each pairwise agreed seed; the sum is the inputs' sum."""
    parties, size, modulus = 5, 1001, 1 << bits
    keys = [crypto.key_pair() for _ in range(parties)]
    info = b"fedsim.secagg mask seed|test"
    rng = np.random.default_rng(bits)
    inputs = rng.integers(0, modulus, size=(parties, size), dtype=np.uint64)
    masked = inputs.copy()
    total_mask = np.zeros(size, dtype=np.uint64)
    for i, j in itertools.combinations(range(parties), 2):
        seed = crypto.agree(keys[i][0], keys[j][1], info)
        assert seed == crypto.agree(keys[j][0], keys[i][1], info)
        pair_mask = crypto.mask(seed, size, bits).astype(np.uint64)
        masked[i] = (masked[i] + pair_mask) % modulus  # the lower index adds,
        masked[j] = (masked[j] + modulus - pair_mask) % modulus  # the higher subtracts
        total_mask = (total_mask + pair_mask) % modulus
    assert total_mask.any()  # the masks are not trivially zero
    for i in range(parties):
        assert (masked[i] != inputs[i]).mean() > 0.9  # each masked input hides its input
    assert np.array_equal(masked.sum(axis=0) % modulus, inputs.sum(axis=0) % modulus)


def test_mask_is_the_rfc8439_chacha20_keystream():
    """Zero key, zero nonce, counter 0: RFC 8439 appendix A.1 test vector #1, read as little-endian uint32 words."""
    expected = [0xADE0B876, 0x903DF1A0, 0xE56A5D40, 0x28BD8653]
    assert crypto.mask(bytes(32), 4, 32).tolist() == expected
    assert crypto.mask(bytes(32), 4, 16).tolist() == [v & 0xFFFF for v in expected]


def test_mask_is_deterministic_exact_length_and_uint32():
    seed = FIXED_SEEDS[0]
    for size in (0, 1, 3, 16383, 16385, 70001):  # odd sizes and sizes around the 64 KiB cipher chunk
        values = crypto.mask(seed, size, 20)
        assert values.dtype == np.uint32
        assert values.shape == (size,)
        assert np.array_equal(values, crypto.mask(seed, size, 20))
    long = crypto.mask(seed, 70001, 32)
    assert np.array_equal(crypto.mask(seed, 1001, 32), long[:1001])  # one keystream, read from its start
    assert np.array_equal(crypto.mask(seed, 70001, 8), long & 0xFF)  # low bits of the same words
    assert int(crypto.mask(seed, 70001, 20).max()) < 1 << 20


@pytest.mark.parametrize("seed", FIXED_SEEDS, ids=SEED_IDS)
def test_mask_bits8_is_uniform(seed):
    values = crypto.mask(seed, 1 << 18, 8)
    counts = np.bincount(values, minlength=256)
    assert counts.shape == (256,)
    assert stats.chisquare(counts).pvalue > 1e-4
    # Flower's legacy randint(0, m - 1) never draws m - 1; every residue occurs here, the extremes included
    assert values.min() == 0
    assert values.max() == 255


@pytest.mark.parametrize("seed", FIXED_SEEDS, ids=SEED_IDS)
def test_mask_bits20_is_uniform_in_high_and_low_bits(seed):
    values = crypto.mask(seed, 1 << 18, 20)
    assert int(values.max()) < 1 << 20
    high = np.bincount(values >> 12, minlength=256)  # bits 12..19: would be skewed by a bad reduction
    low = np.bincount(values & 0xFF, minlength=256)
    assert high.shape == low.shape == (256,)
    assert stats.chisquare(high).pvalue > 1e-4
    assert stats.chisquare(low).pvalue > 1e-4


def test_masks_of_different_seeds_are_uncorrelated():
    n = 1 << 18
    bound = 5 / np.sqrt(n)
    base = crypto.mask(FIXED_SEEDS[0], n, 16).astype(np.float64)
    flipped = bytes([FIXED_SEEDS[0][0] ^ 1]) + FIXED_SEEDS[0][1:]  # one bit of the seed changed
    for other_seed in [*FIXED_SEEDS[1:], flipped]:
        other = crypto.mask(other_seed, n, 16).astype(np.float64)
        assert abs(stats.pearsonr(base, other).statistic) < bound
    assert abs(stats.pearsonr(base[:-1], base[1:]).statistic) < bound  # nor is a mask with itself shifted


@pytest.mark.parametrize(
    ("seed", "size", "bits", "message"),
    [
        (bytes(32), 10, 0, r"mask bits must be in 1\.\.32, got 0"),
        (bytes(32), 10, 33, r"mask bits must be in 1\.\.32, got 33"),
        (bytes(32), 10, 8.0, "mask bits must be an integer, got 8.0"),
        (bytes(31), 10, 8, "mask seed must be exactly 32 bytes, got 31 bytes"),
        ("0" * 32, 10, 8, "mask seed must be bytes, got str"),
        (bytes(32), -1, 8, "mask size must be >= 0, got -1"),
    ],
)
def test_mask_refusals(seed, size, bits, message):
    with pytest.raises(SecAggError, match=message):
        crypto.mask(seed, size, bits)


# --------------------------------------------------------------------------------------------------------- Shamir


def test_any_threshold_shares_reconstruct_a_small_split():
    secret = crypto.random_seed()
    shares = crypto.split(secret, 3, 5)
    assert len(shares) == 5
    assert all(len(share) == crypto.SHARE_BYTES == 68 for share in shares)
    assert [int.from_bytes(share[:2], "big") for share in shares] == [1, 2, 3, 4, 5]
    for count in (3, 4, 5):
        for subset in itertools.combinations(shares, count):
            assert crypto.combine(list(subset), 3) == secret
    for subset in itertools.combinations(shares, 2):
        with pytest.raises(SecAggError, match="2 distinct shares given, 3 needed"):
            crypto.combine(list(subset), 3)


def test_51_of_100_reconstructs_from_random_subsets_and_not_from_fewer():
    secret = crypto.random_seed()
    shares = crypto.split(secret, 51, 100)
    rng = random.Random(37)
    for _ in range(5):
        assert crypto.combine(rng.sample(shares, 51), 51) == secret
    assert crypto.combine(rng.sample(shares, 80), 51) == secret
    subset = rng.sample(shares, 50)
    with pytest.raises(SecAggError, match="50 distinct shares given, 51 needed"):
        crypto.combine(subset, 51)
    with pytest.raises(SecAggError, match="50 distinct shares given, 51 needed"):
        crypto.combine([*subset, subset[0]], 51)  # a repeated share is not a new one


def test_fewer_than_threshold_shares_do_not_give_the_secret():
    secret = crypto.random_seed()
    shares = crypto.split(secret, 4, 6)
    held_x = {int.from_bytes(share[:2], "big") for share in shares[:3]}
    forged_x = 7
    assert forged_x not in held_x
    forged = forged_x.to_bytes(2, "big") + crypto.random_seed().rjust(66, b"\x00")
    assert _reconstructs([*shares[:3], forged], 4) != secret
    assert _reconstructs(shares[:3], 3) != secret  # interpolating the t - 1 shares as if they were enough
    # An altered y in one of exactly threshold shares also loses the secret
    altered = shares[0][:-1] + bytes([shares[0][-1] ^ 1])
    assert _reconstructs([altered, *shares[1:4]], 4) != secret
    # The sanity check on the same data: the genuine fourth share does reconstruct
    assert crypto.combine(shares[:4], 4) == secret


def test_shares_of_different_splits_do_not_mix():
    secret = crypto.random_seed()
    first, second = crypto.split(secret, 2, 3), crypto.split(secret, 2, 3)
    assert first != second  # fresh random coefficients
    assert _reconstructs([first[0], second[1]], 2) != secret


@pytest.mark.parametrize(
    "secret",
    [b"", b"\x00", b"\x00" * 32, b"\x00\x00\x07secret", b"\xff" * 64, bytes(range(64))],
)
def test_secrets_come_back_byte_for_byte(secret):
    shares = crypto.split(secret, 2, 3)
    assert crypto.combine(shares[1:], 2) == secret
    assert _reconstructs(shares[:1], 1) != secret  # one share of a 2-of-3 split is a random field element
    assert crypto.combine(crypto.split(secret, 1, 4)[2:3], 1) == secret


def test_x25519_private_keys_come_back_exactly():
    for _ in range(5):
        private, public = crypto.key_pair()
        shares = crypto.split(private, 3, 7)
        recovered = crypto.combine([shares[6], shares[0], shares[3]], 3)
        assert recovered == private
        assert crypto.public_of(recovered) == public


@pytest.mark.parametrize(
    ("secret", "threshold", "holders", "message"),
    [
        (b"s", 0, 5, "threshold must satisfy 1 <= threshold <= holders = 5, got threshold 0"),
        (b"s", 6, 5, "threshold must satisfy 1 <= threshold <= holders = 5, got threshold 6"),
        (b"s", 1, 0, r"holders must be in 1\.\.65535, got 0"),
        (b"s", 1, 65536, r"holders must be in 1\.\.65535, got 65536"),
        (b"s", True, 5, "threshold must be an integer, got True"),
        (b"s" * 65, 2, 5, "secret must be at most 64 bytes, got 65 bytes"),
        ("s", 2, 5, "secret must be bytes, got str"),
    ],
)
def test_split_refusals(secret, threshold, holders, message):
    with pytest.raises(SecAggError, match=message):
        crypto.split(secret, threshold, holders)


def test_combine_refuses_malformed_shares():
    shares = crypto.split(b"secret", 2, 3)
    with pytest.raises(SecAggError, match="share 1 must be exactly 68 bytes, got 67 bytes"):
        crypto.combine([shares[0], shares[1][:-1]], 2)
    with pytest.raises(SecAggError, match="share 0 has x = 0"):
        crypto.combine([bytes(2) + shares[0][2:], shares[1]], 2)
    with pytest.raises(SecAggError, match="share 0 has y >= 2"):
        crypto.combine([shares[0][:2] + b"\xff" * 66, shares[1]], 2)
    conflicting = shares[0][:-1] + bytes([shares[0][-1] ^ 1])
    with pytest.raises(SecAggError, match="two different shares with x = 1"):
        crypto.combine([shares[0], conflicting, shares[1]], 2)
    with pytest.raises(SecAggError, match=r"threshold must be in 1\.\.65535, got 0"):
        crypto.combine(shares, 0)
    with pytest.raises(SecAggError, match="shares must be a list of shares"):
        crypto.combine(shares[0], 1)


# ----------------------------------------------------------------------------------------------------------- AEAD


def test_aead_round_trip_and_fresh_nonces():
    key = crypto.random_seed()
    plaintext = b"share of client 3 for client 7" + bytes(100)
    associated = b"session-1|3->7"
    first = crypto.encrypt(key, plaintext, associated)
    second = crypto.encrypt(key, plaintext, associated)
    assert first != second
    assert first[:12] != second[:12]
    assert len(first) == 12 + len(plaintext) + 16
    assert crypto.decrypt(key, first, associated) == plaintext
    assert crypto.decrypt(key, second, associated) == plaintext
    assert crypto.decrypt(key, crypto.encrypt(key, b"", b""), b"") == b""


def test_aead_refuses_wrong_key_altered_ciphertext_and_other_context():
    key = crypto.random_seed()
    associated = b"session-1|3->7"
    ciphertext = crypto.encrypt(key, b"share", associated)
    with pytest.raises(DecryptionError, match="does not authenticate"):
        crypto.decrypt(crypto.random_seed(), ciphertext, associated)
    for position in (0, 12, len(ciphertext) - 1):  # nonce, body, tag
        altered = bytearray(ciphertext)
        altered[position] ^= 0x01
        with pytest.raises(DecryptionError, match="does not authenticate"):
            crypto.decrypt(key, bytes(altered), associated)
    with pytest.raises(DecryptionError, match="does not authenticate"):
        crypto.decrypt(key, ciphertext, b"session-1|3->8")
    with pytest.raises(DecryptionError, match="shorter than a nonce and a tag"):
        crypto.decrypt(key, ciphertext[:27], associated)
    assert issubclass(DecryptionError, SecAggError)
    assert issubclass(SecAggError, ValueError)


def test_aead_refuses_keys_that_are_not_256_bits():
    with pytest.raises(SecAggError, match="encryption key must be exactly 32 bytes, got 16 bytes"):
        crypto.encrypt(bytes(16), b"x", b"")
    with pytest.raises(SecAggError, match="encryption key must be exactly 32 bytes, got 16 bytes"):
        crypto.decrypt(bytes(16), bytes(40), b"")
