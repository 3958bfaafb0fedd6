"""Packed level histograms on the protocol path (run_gbdt(packed_levels=True)): the same trees
in fewer bytes, dense where a secure sum or DP is due, a hostile packed reply refused naming
its site; and the site's batched bin summary and label keys give the same answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedtab.engines.local import LocalFederation
from fedtab.federation.workflows.gbdt import run_gbdt
from fedtab.federation.workflows.gbdt.site import PACKED
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import SiteError, set_options
from fedtab.federation.site.core import Site
from fedtab.federation.site.matrices import class_indices, label_key, label_keys
from tests.builders import gbdt_parts, make_sites

FAST = {"n_trees": 3, "max_depth": 3, "max_bins": 32}
OPT_IN = {"min_rows": 10, "allow_server_row_sets": True}


def _fed(parts, **options) -> LocalFederation:
    fed = LocalFederation(make_sites(parts, policy=OPT_IN))
    if options:
        set_options(fed, **options)
    return fed


def _same_trees(a, b) -> None:
    A, B = a.to_arrays(), b.to_arrays()
    assert A.keys() == B.keys()
    for k in A:
        np.testing.assert_array_equal(A[k], B[k], err_msg=k)


class _Spy(Site):
    """A site that keeps the arrays of its ``gbdt_level`` replies."""

    def handle(self, request: Message) -> Message:
        reply = super().handle(request)
        if request.kind == "gbdt_level":
            self.__dict__.setdefault("sent", []).append(set(reply.arrays))
        return reply


def test_packed_levels_grow_the_same_trees_in_fewer_bytes():
    parts = gbdt_parts(3, 1200, 0.05, "f3")
    dense = run_gbdt(_fed(parts), None, params=FAST)
    packed = run_gbdt(_fed(parts), None, params=FAST, packed_levels=True)
    _same_trees(dense.model, packed.model)
    assert packed.withheld == dense.withheld  # the same release rules, the same withheld nodes
    d = [e for e in dense.level_exchanges if e["nodes"]]
    p = [e for e in packed.level_exchanges if e["nodes"]]
    assert len(d) == len(p)
    assert sum(e["bytes_up"] for e in p) < 0.7 * sum(e["bytes_up"] for e in d)
    # what the engine moved: the wire packs every compressible array losslessly, dense levels too
    assert sum(e["wire_up"] for e in p) < sum(e["wire_up"] for e in d)


def test_a_secure_run_sends_dense_histograms_even_when_packing_is_asked():
    parts = gbdt_parts(4, 900, 0.0, None)
    spies = [_Spy(f"s{i}", p, "target", policy={"min_rows": 10}) for i, p in enumerate(parts)]
    fed = LocalFederation(spies)
    set_options(fed, secure_aggregation=True)
    secure = run_gbdt(fed, None, params=FAST, packed_levels=True)
    plain = run_gbdt(_fed(parts), None, params=FAST, packed_levels=True)
    _same_trees(plain.model, secure.model)
    assert all(PACKED not in arrays for s in spies for arrays in s.sent)


def test_a_site_packs_only_when_asked():
    parts = gbdt_parts(5, 600, 0.0, None)
    spies = [_Spy(f"s{i}", p, "target", policy=OPT_IN) for i, p in enumerate(parts)]
    run_gbdt(LocalFederation(spies), None, params=FAST)
    assert all(PACKED not in arrays for s in spies for arrays in s.sent)
    run_gbdt(LocalFederation(spies), None, params=FAST, packed_levels=True)
    assert any(PACKED in arrays for s in spies for arrays in s.sent)


class _BadPack(Site):
    """A site whose packed level replies are changed by ``tamper(values, mask)``."""

    tamper = staticmethod(lambda v, m: (v, m))

    def handle(self, request: Message) -> Message:
        reply = super().handle(request)
        if request.kind == "gbdt_level" and PACKED in reply.arrays:
            v, m = self.tamper(np.array(reply.arrays["hist"]), np.array(reply.arrays[PACKED]))
            return Message(reply.kind, {**reply.arrays, "hist": v, PACKED: m}, reply.meta)
        return reply


@pytest.mark.parametrize("tamper, match", [
    (lambda v, m: (v, m[:-1]), "uint8 bytes"),
    (lambda v, m: (v[:-1], m), "integers"),
    (lambda v, m: (v.astype(np.int64) * 2**30, m), "exceeds|disagree"),  # sums far beyond its rows, in grid units
    (lambda v, m: (np.abs(v) * np.array([1, -1]), m), "negative hessian"),
])
def test_a_hostile_packed_level_is_refused_naming_the_site(tamper, match):
    parts = gbdt_parts(10, 1200, 0.05, "f3")
    bad = _BadPack("evil", parts[2], "target", policy=OPT_IN)
    bad.tamper = staticmethod(tamper)
    with pytest.raises(SiteError, match=match) as info:
        run_gbdt(LocalFederation([*make_sites(parts[:2], policy=OPT_IN), bad]), None, params=FAST, packed_levels=True)
    assert "evil" in str(info.value) and "s0" not in str(info.value)


def test_a_packed_histogram_where_a_dense_one_is_due_is_refused():
    parts = gbdt_parts(11, 900, 0.0, None)

    class Packs(Site):  # packs even inside a secure sum: its clear part then carries the mask
        def handle(self, request: Message) -> Message:
            reply = super().handle(request)
            if request.kind == "gbdt_level" and not reply.is_error and request.arrays.get("nodes") is not None \
                    and request.arrays["nodes"].size:
                return Message(reply.kind, {**reply.arrays, PACKED: np.zeros(1, np.uint8)}, reply.meta)
            return reply

    fed = LocalFederation([*make_sites(parts[:2], policy={"min_rows": 10}),
                           Packs("evil", parts[2], "target", policy={"min_rows": 10})])
    set_options(fed, secure_aggregation=True)
    with pytest.raises(SiteError, match="dense one was due") as info:
        run_gbdt(fed, None, params=FAST)
    assert "evil" in str(info.value) and "s0" not in str(info.value)


# ----------------------------------------------------------------------------- site helpers
@pytest.mark.parametrize("values", [
    np.array([1, 0, 1, 2]), np.array([1.0, 0.0, np.nan, 2.5, -0.0]), np.array([True, False, True]),
    np.array(["a", "b", "a"], dtype=object), np.array(["x", "y"]),
    np.array([1, "1", True, 1.0, None], dtype=object),  # 1, True and 1.0 compare equal: keyed one by one
    [1.0, "a", 2], np.array([], dtype=float),
])
def test_label_keys_are_label_key_of_every_value(values):
    got = label_keys(values)
    assert got.dtype.kind == "U" and got.shape == (len(values),)
    assert got.tolist() == [label_key(v) for v in values]


def test_class_indices_map_labels_and_refuse_unknown_ones():
    y = pd.Series(["<=50K", ">50K", "<=50K", ">50K"], dtype="string").to_numpy()
    np.testing.assert_array_equal(class_indices(y, ["<=50K", ">50K"]), [0, 1, 0, 1])
    np.testing.assert_array_equal(class_indices(np.array([2.0, 1.0, 2.0]), ["1", "2"]), [1, 0, 1])
    assert class_indices(np.array([], dtype=object), ["a"]).shape == (0,)
    with pytest.raises(ValueError, match=r"\['3'\]"):
        class_indices(np.array([1, 3]), ["1", "2"])
