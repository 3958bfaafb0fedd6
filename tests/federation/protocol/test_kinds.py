"""The message-kind registry (issue 28 item 1, issue 29 item 2): one declaration per kind, every
other table derived from it, no table of kind names written by hand anywhere else."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedtab.engines.progress import ProgressLog, round_kinds
from fedtab.federation import Message, Site, register_all
from fedtab.federation.protocol.kinds import KINDS, TABLE_STEP_HOMES, MessageKind, Progress, declare, forget, summed_kinds
from fedtab.federation.site.core import HANDLER_HOMES, HANDLERS, RELEASES, TABLE_STEPS
from fedtab.federation.site.registry import handler, table_step
from fedtab.privacy import DisclosurePolicy
from fedtab.privacy.gate import COUNT, Releases
from fedtab.report.disclosure import WHAT, disclosure, disclosure_summary

SRC = Path(__file__).resolve().parents[3] / "src" / "fedtab"


def _own() -> dict[str, MessageKind]:
    """fedtab's own declarations (a test's toy kinds left out)."""
    return {n: k for n, k in KINDS.items() if k.home.startswith("fedtab.")}


def test_every_registered_handler_is_declared_and_every_declaration_has_its_handler():
    pytest.importorskip("torch")  # the imputation module registers its handlers only with torch
    register_all()
    own = {n: fn for n, fn in HANDLERS.items() if fn.__module__.startswith("fedtab.")}
    assert set(own) == set(_own())
    for name, fn in own.items():  # registered by the module the declaration names (lazy imports find it)
        assert fn.__module__ == KINDS[name].home, name
    steps = {n: fn.__module__ for n, fn in TABLE_STEPS.items() if fn.__module__.startswith("fedtab.")}
    assert steps == TABLE_STEP_HOMES


def test_registering_an_undeclared_kind_or_table_step_raises():
    with pytest.raises(ValueError, match="not declared"):
        handler("no_such_kind")
    with pytest.raises(ValueError, match="not declared"):
        table_step("no_such_step")
    assert "no_such_kind" not in HANDLERS and "no_such_kind" not in RELEASES
    with pytest.raises(ValueError, match="already declared"):  # a second, different declaration of a kind
        declare(MessageKind("fit", "elsewhere", Releases(part=None), "another fit"))


def test_every_kind_is_described_and_summable_arrays_are_declared_arrays():
    for name, kind in _own().items():
        assert kind.description.strip(), name
        # what the report says: a description of the declaration (placeholders of the run filled)
        assert WHAT[name] == kind.description
        if kind.summed:
            assert any(kind.summable(a) for a in (*kind.releases.aggregates, *kind.releases.cells,
                                                  *kind.releases.histograms, "param:x", "w/x")), name
        assert not any(kind.summable(k) for k in kind.releases.keys), name
    # the literal array names of the registry agree with the algorithms' own constants
    from fedtab.election.score_test import NEWTON_KEYS, SCORE_KEYS
    from fedtab.impute.stats import STAT_ARRAYS

    assert KINDS["score_sums"].releases.aggregates == (*NEWTON_KEYS, *SCORE_KEYS)
    stats = KINDS["impute_stats"].releases
    assert {*stats.cells, *(a for v in stats.cells.values() for a in v)} == set(STAT_ARRAYS)
    assert stats.dp_releases == len(STAT_ARRAYS)


def test_the_kinds_the_issue_found_missing_are_summed_and_per_site_ones_are_not():
    summed = summed_kinds()
    assert {"gbdt_start", "gbdt_level", "gbdt_evaluate", "gbdt_score", "gbdt_importance", "select_prepare",
            "select_fit", "select_evaluate", "describe", "fit", "evaluate", "impute_stats"} <= summed
    assert not summed & {"ballot", "ballot_fit", "schema", "job_profile", "local_baseline", "category_sets",
                         "secagg_keys"}
    prepare = KINDS["select_prepare"]  # its ballots are per-site, its moments summable
    assert prepare.summable("moment_sum") and not prepare.summable("ballot_mask")


# ----------------------------------------------------------------------------- a toy kind everywhere
def _deny(policy, site, request):
    return "the toy check refuses" if request.meta.get("deny") else None


@pytest.fixture
def toy():
    kind = declare(MessageKind(
        "toy_sums", __name__, Releases(part="=train", cells={"toy_count": ("toy_sum",)}, meta={"n": COUNT}),
        "toy sums over the training rows", summed=True, check=_deny, server_row_set=True,
        summary=("gradient histograms",), progress=Progress("toy step", "training.rounds")))

    @handler("toy_sums")
    def _toy(site: Site, request: Message) -> Message:
        x = site.table[["a"]].to_numpy(dtype=float)
        return Message("toy_sums", {"toy_count": np.array([len(x)]), "toy_sum": x.sum(0)}, {"n": len(x)})

    yield kind
    HANDLERS.pop("toy_sums", None)
    forget("toy_sums")


def _site(policy=None) -> Site:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2))
    return Site("t0", pd.DataFrame(x, columns=["a", "b"]).assign(y=(x[:, 0] > 0).astype(int)), "y",
                policy=policy or DisclosurePolicy(min_rows=5))


def test_a_toy_kind_declared_once_appears_in_every_derived_table(toy):
    assert "toy_sums" in HANDLER_HOMES[__name__]  # handler homes
    assert RELEASES["toy_sums"] is toy.releases  # the gate's declaration
    assert "toy_sums" in summed_kinds()  # secure-aggregation kinds (the require flags)
    assert "toy_sums" in round_kinds() and round_kinds()["toy_sums"][0] == "toy step"  # progress kinds
    assert WHAT["toy_sums"] == "toy sums over the training rows"  # disclosure table
    site = _site()
    assert not site.handle(Message("toy_sums")).is_refusal
    # the policy check: the declaration's check runs
    assert "toy check refuses" in site.handle(Message("toy_sums", meta={"deny": True})).meta["reason"]
    # the require flags: summed, so refused in the clear
    strict = _site(DisclosurePolicy(min_rows=5, require_secure_aggregation=True))
    assert "require_secure_aggregation" in strict.handle(Message("toy_sums")).meta["reason"]
    # the gate: the part's floor and the cell suppression follow the declaration
    small = _site(DisclosurePolicy(min_rows=1000))
    assert "fewer than the site's min_rows=1000" in small.handle(Message("toy_sums")).meta["reason"]
    # the report: its description, its header phrase, "masked" in a secure run
    result = {"participation": {"exchanges": [{"step": "toy_sums", "sites": ["t0"]}]},
              "privacy": {"secure_aggregation": True}}
    assert "toy sums over the training rows" in disclosure(result)
    assert "masked: the server learned only the sum" in disclosure(result)
    assert "gradient histograms" in disclosure_summary(result)
    # the progress line of an exchange of it counts the step's rounds
    lines: list[str] = []

    from fedtab.job.exchange_plan import exchange_plan
    from fedtab.job.spec import parse_job

    spec = parse_job({"target": "y", "training": {"rounds": 7}}, sites_required=False)
    log = ProgressLog(exchange_plan(spec), emit=lines.append)
    log.exchange("toy_sums", 1, 1)
    assert '"round": 1, "rounds": 7' in lines[-1] and '"step": "toy step"' in lines[-1]


def test_a_forgotten_toy_kind_leaves_every_derived_table():
    assert "toy_sums" not in RELEASES and "toy_sums" not in WHAT and "toy_sums" not in round_kinds()
    assert not any("toy_sums" in kinds for kinds in HANDLER_HOMES.values())


# ----------------------------------------------------------------------------- no hand-kept table
#: ``(module path, assigned name): why`` -- tables of kind names that are not declarations
ALLOWED = {
    ("testing/hostile.py", "STEPS"): "a hostile site's attack plan (which steps it corrupts), not a declaration",
    ("testing/hostile.py", "_ROW_CLAIMS"): "a hostile site's attack plan (which arrays it scales)",
}


def _direct(node: ast.AST, kinds: set[str]) -> list[str]:
    """Kind names among the elements (keys) of a dict or set literal."""
    if isinstance(node, ast.Dict):
        elts = [k for k in node.keys if k is not None]
    elif isinstance(node, ast.Set):
        elts = node.elts
    else:
        return []
    return [e.value for e in elts if isinstance(e, ast.Constant) and e.value in kinds]


def _tables(path: Path, kinds: set[str]) -> list[tuple[str, int, list[str]]]:
    """``(name, line, kind names)`` of every table of two or more kind names in ``path``: a
    module-level assignment whose value holds them anywhere (a dict of tuples, a frozenset), or a
    dict or set literal of them anywhere in the code. A tuple in an expression
    (``kind in ("fit", "impute_fit")``) is logic, not a table; ``__all__`` is no table."""
    tree = ast.parse(path.read_text())
    found, seen = [], set()
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        name = getattr(target.value if isinstance(target, ast.Subscript) else target, "id", "?")
        seen.update(id(n) for n in ast.walk(node.value))
        hits = sorted({n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant) and n.value in kinds})
        if name != "__all__" and len(hits) >= 2:
            found.append((name, node.lineno, hits))
    for node in ast.walk(tree):
        hits = sorted(set(_direct(node, kinds)))
        if id(node) not in seen and len(hits) >= 2:
            found.append(("(literal)", node.lineno, hits))
    return found


def test_no_module_keeps_a_hand_written_table_of_kind_names():
    kinds = set(_own())
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "federation/protocol/kinds.py":
            continue
        for name, line, hits in _tables(path, kinds):
            if (rel, name) not in ALLOWED:
                offenders.append(f"{rel}:{line} {name} {hits[:4]}")
    assert not offenders, "declare these in fedtab.federation.protocol.kinds instead:\n" + "\n".join(offenders)


def test_the_scan_finds_the_tables_the_registry_replaced(tmp_path):
    kinds = set(_own())
    probe = tmp_path / "probe.py"
    probe.write_text('SUMMED_KINDS = frozenset({"describe", "fit"})\n'
                     'HOMES = {"m": ("ballot", "set_mask")}\n'
                     'def f(kind):\n'
                     '    groups = [({"describe", "set_mask"}, "moments")]\n'
                     '    return kind in ("fit", "impute_fit")\n')
    assert [name for name, _, _ in _tables(probe, kinds)] == ["SUMMED_KINDS", "HOMES", "(literal)"]
