from rlvr.seeds import Seeds, sub_seed


def test_sub_seeds_are_stable_named_and_distinct():
    s = Seeds.from_root(0)
    assert s == Seeds.from_root(0)
    assert len({s.data, s.sampler, s.init, s.lora}) == 4
    assert s.data == sub_seed(0, "data") and 0 <= s.data < 2**63
    # the documented hash, written out: sha256("0/data")[:8] big-endian mod 2**63
    import hashlib

    assert s.data == int.from_bytes(hashlib.sha256(b"0/data").digest()[:8], "big") % 2**63


def test_different_roots_give_different_sub_seeds():
    a, b = Seeds.from_root(0), Seeds.from_root(1)
    assert all(x != y for x, y in zip(list(a.as_dict().values())[1:], list(b.as_dict().values())[1:]))
