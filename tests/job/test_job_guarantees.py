"""The job file carries every guarantee (issue 21, items 1-5): ``[privacy]``, ``[trust]`` and
``[election] method`` are validated, reach the workflows from one place, are recorded in
``result.json`` and ``report.html``, and give the same model on every engine."""

from __future__ import annotations

import ast
import json
import re
import tomllib
from dataclasses import fields
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedtab.job.guarantees import accountant_dp, dp_for, releasing_steps, run_plan
from fedtab.job.run import run_job
from fedtab.job.spec import (DP_KEYS, JobError, JobSpec, check_spec, load_job, parse_job, spec_from_plan, _SECTIONS)
from tests.builders import classification_parts, write_classification_sites, write_site_configs

ROOT = Path(__file__).resolve().parents[2]
BASE = {"target": "y", "sites": {"a": {"path": "a.csv"}, "b": {"path": "b.csv"}, "c": {"path": "c.csv"}}}
GUARDED = {"privacy": {"secure_aggregation": True}, "trust": {"min_sites": 2, "timeout": 600, "min_holders": 2}}


# ----------------------------------------------------------------------------- item 1: the spec
def test_privacy_trust_and_method_parse_and_travel_in_the_plan():
    spec = load_job({**BASE, "privacy": {"dp": {"epsilon": 8.0, "delta": 1e-5, "bounds": [-10.0, 10.0]}},
                     "trust": {"min_sites": 2, "timeout": 600, "min_holders": 2, "robust": True,
                               "max_site_share": 0.4},
                     "election": {"method": "vote", "score_test_alpha": 0.1}})
    assert spec.privacy.dp == {"epsilon": 8.0, "delta": 1e-5, "bounds": [-10.0, 10.0], "clip": 1.0}
    assert (spec.trust.min_sites, spec.trust.timeout, spec.trust.robust) == (2, 600.0, True)
    assert spec.election.method == "vote" and spec.election.score_test_alpha == 0.1
    assert load_job({**BASE, "election": {"method": "score-test"}}).election.method == "score-test"
    back = spec_from_plan(json.dumps(spec.plan()))
    assert back.plan() == spec.plan() and [s.name for s in back.sites] == ["a", "b", "c"]
    assert all(s.path is None for s in back.sites)  # the server never learns where the tables are
    assert spec_from_plan(spec.to_dict()).to_dict()["privacy"] == spec.to_dict()["privacy"]


@pytest.mark.parametrize("doc, fragment", [
    ({"privcy": {}}, "unknown key 'privcy' (did you mean 'privacy'?)"),
    ({"trust": {"min_site": 2}}, "unknown key [trust] 'min_site' (did you mean 'min_sites'?)"),
    ({"privacy": {"secure_aggregaton": True}}, "(did you mean 'secure_aggregation'?)"),
    ({"privacy": {"dp": {"epsilom": 1}}}, "unknown key [privacy] dp.'epsilom' (did you mean 'epsilon'?)"),
    ({"privacy": {"dp": {"epsilon": 0}}}, "[privacy] dp needs epsilon > 0"),
    ({"privacy": {"dp": {"epsilon": 1, "bounds": [3, 1]}}}, "[privacy] dp.bounds must be [low, high]"),
    ({"privacy": {"dp": {"epsilon": 1, "bounds": {"x": [0, "a"]}}}}, "[privacy] dp.bounds.x must be [low, high]"),
    ({"privacy": {"dp": 8}}, "[privacy] dp must be a table"),
    ({"privacy": {"secure_aggregation": "yes"}}, "[privacy] secure_aggregation must be true or false"),
    ({"trust": {"min_sites": 4}}, "[trust] min_sites = 4 but the job has 3 site(s)"),
    ({"trust": {"min_sites": 0}}, "[trust] min_sites must be a positive integer"),
    ({"trust": {"timeout": -1}}, "[trust] timeout must be a positive number of seconds"),
    ({"trust": {"timeout": "soon"}}, "[trust] timeout must be a number"),
    ({"trust": {"max_site_share": 1.5}}, "max_site_share must be in (0, 1]"),
    ({"trust": {"robust": True}, "privacy": {"secure_aggregation": True}},
     "[trust] robust cannot be combined with [privacy] secure_aggregation"),
    ({"election": {"tune": "grid"}, "privacy": {"secure_aggregation": True}},
     "cannot be combined with [election] tune"),
    ({"election": {"method": "score-test"}, "privacy": {"dp": {"epsilon": 1}}}, "has no DP or robust mode"),
    ({"schema": {"profile": True}, "privacy": {"secure_aggregation": True}}, "[schema] profile = true sends"),
    ({"evaluation": {"baselines": True}, "privacy": {"dp": {"epsilon": 1}}}, "[evaluation] baselines = true"),
    ({"training": {"model": "gnb"}, "privacy": {"dp": {"epsilon": 1}}}, "dp is not available for the exact"),
    ({"election": {"method": "lasso"}}, "[election] method must be one of ['vote', 'score-test']"),
])
def test_guarantee_errors_are_one_line_and_name_the_key(doc, fragment):
    with pytest.raises(JobError, match=re.escape(fragment)) as err:
        load_job({**BASE, **doc})
    assert "\n" not in str(err.value)


def test_a_spec_built_in_code_is_checked_like_a_job_file():
    from fedtab.job.spec import SiteSpec, TrustSpec

    spec = JobSpec(target="y", sites=[SiteSpec("a", None)], trust=TrustSpec(min_sites=2), source="my code")
    with pytest.raises(JobError, match=re.escape("my code: [trust] min_sites = 2 but the job has 1 site(s)")):
        check_spec(spec)


def _documented_keys() -> str:
    return (ROOT / "docs" / "job.md").read_text()


def test_docs_job_md_documents_every_key():
    text = _documented_keys()
    table = text[text.index("### Keys"):text.index("## Running it")]
    for section, cls in _SECTIONS.items():
        row = next((line for line in table.splitlines() if line.startswith(f"| `[{section}]`")), None)
        assert row is not None, f"docs/job.md has no row for [{section}]"
        for f in fields(cls):
            assert f"`{f.name}`" in row, f"docs/job.md's [{section}] row does not document {f.name!r}"
    for key in DP_KEYS:
        assert f"`{key}`" in text[text.index("### Privacy and trust"):]


def test_docs_privacy_and_trust_block_is_a_valid_job():
    text = _documented_keys()
    block = re.search(r"### Privacy and trust\n\n```toml\n(.*?)```", text, re.S).group(1)
    spec = parse_job({**BASE, **tomllib.loads(block)})
    assert spec.privacy.secure_aggregation and spec.privacy.dp["epsilon"] == 8.0 and spec.trust.min_sites == 2


# ----------------------------------------------------------------------------- item 3: one place per setting
#: the workflows whose keyword arguments carry a setting; only the job's step modules call them
WORKFLOWS = {"run_election", "run_training", "run_imputation", "run_pooled_score_test", "tune_flow", "run_baselines",
             "ImputeConfig"}


def test_only_the_step_modules_turn_settings_into_workflow_arguments():
    """Front doors (job/, cli/, estimators/, engines/) never call a workflow themselves: the step modules
    under job/steps/ are the one place where the spec's settings become keyword arguments."""
    calls = []
    for package in ("job", "cli", "estimators", "engines"):
        for path in sorted((ROOT / "src" / "fedtab" / package).rglob("*.py")):
            if path.parent.name == "steps":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", getattr(node.func, "attr", None))
                    if name in WORKFLOWS:
                        calls.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert calls == []


def test_the_dp_budget_is_split_so_the_steps_never_spend_more_than_the_total():
    spec = load_job({**BASE, "impute": {}, "election": {}, "evaluation": {"all_columns": True},
                     "privacy": {"dp": {"epsilon": 6.0, "delta": 1e-5}}})
    assert releasing_steps(spec) == ["imputation", "election", "training", "all_columns"]
    shares = [dp_for(spec, s) for s in releasing_steps(spec)]
    assert sum(s["epsilon"] for s in shares) == pytest.approx(6.0) and sum(s["delta"] for s in shares) <= 1e-5
    with pytest.raises(ValueError, match="makes no DP release"):
        dp_for(spec, "tuning")
    assert dp_for(load_job(BASE), "training") is None
    # one accountant pays for the election, the training and the all-columns comparison: the rest
    acc = accountant_dp(spec)
    assert acc["epsilon"] == pytest.approx(4.5) and acc["delta"] == pytest.approx(0.75e-5)
    assert dp_for(spec, "imputation")["epsilon"] + acc["epsilon"] == pytest.approx(6.0)
    plan, _ = run_plan(spec)
    single, _ = run_plan(load_job({**BASE, "election": {}, "privacy": {"dp": {"epsilon": 6.0}}}))
    assert plan["training.fit"] == 2 * single["training.fit"] > 0  # the comparison trains again
    assert plan["election.ballot"] == 1 and plan["training.describe"] == 3  # only the comparison describes


@pytest.fixture(scope="module")
def site_files(tmp_path_factory) -> list[dict]:
    return write_classification_sites(tmp_path_factory.mktemp("guarded_sites"), 600, 10, 4, 2, table_seed=7,
                                      split_seed=3)


def _job(configs: list[dict], out: Path, **sections) -> dict:
    doc = {"target": "target", "sites": {c["name"]: {"path": c["data-path"]} for c in configs},
           "election": {"freedom_degree": 0.5}, "training": {"rounds": 2, "local_epochs": 1},
           "run": {"out": str(out)}}
    doc.update(sections)
    return doc


def test_every_guarantee_reaches_its_workflow(site_files, tmp_path, monkeypatch):
    """The spec's settings arrive as the run's options when each workflow starts: captured at the
    workflows themselves (imputation, election, training)."""
    pytest.importorskip("torch")
    import fedtab.federation.workflows.election.server as election_flow
    import fedtab.federation.workflows.imputation as imputation
    import fedtab.federation.workflows.training as training

    seen = {}
    for module, name in ((imputation, "run_imputation"), (election_flow, "run_election"), (training, "run_training")):
        real = getattr(module, name)

        def spy(federation, *a, _real=real, _name=name, **kw):
            seen[_name] = {"options": federation.options, "ledger": federation.privacy_ledger,
                           "min_sites": federation.min_sites, "timeout": federation.timeout}
            return _real(federation, *a, **kw)

        monkeypatch.setattr(module, name, spy)
    run_job(_job(site_files, tmp_path, trust={"robust": True, "max_site_share": 0.45, "min_sites": 2,
                                               "timeout": 300, "min_holders": 2},
                 privacy={"dp": {"epsilon": 6.0, "delta": 1e-5, "bounds": [-10, 10]}},
                 impute={"rounds": 1, "hidden_dim": 4, "n_layers": 1}))
    im, el, tr = (seen[k]["options"] for k in ("run_imputation", "run_election", "run_training"))
    for o in (im, el, tr):
        assert (o.robust, o.max_site_share, o.secure, o.trust.min_holders) == (True, 0.45, False, 2)
        assert o.dp["bounds"] == [-10, 10]
    # the imputation's share (a third), the run's one accountant the rest for the election and the training
    assert im.dp["epsilon"] == pytest.approx(2.0) and el.dp["epsilon"] == tr.dp["epsilon"] == pytest.approx(4.0)
    ledger = seen["run_election"]["ledger"]
    assert ledger is not None and seen["run_training"]["ledger"] is ledger
    assert set(ledger.plan) >= {"election.ballot", "election.describe", "training.fit", "training.evaluate"}
    assert all(v["min_sites"] == 2 and v["timeout"] == 300.0 for v in seen.values())


# ----------------------------------------------------------------------------- items 4 and 5
def test_a_dp_job_spends_within_its_budget_and_records_it(site_files, tmp_path):
    result = run_job(_job(site_files, tmp_path, privacy={"dp": {"epsilon": 4.0, "delta": 1e-5, "bounds": [-10, 10]}}))
    dp = result["privacy"]["dp"]
    assert dp["epsilon"] == 4.0 and 0 < dp["epsilon_spent"] <= 4.0 + 1e-9
    assert set(dp["steps"]) == {"run"} and dp["steps"]["run"]["steps"] == ["election", "training"]
    assert all(0 < s["epsilon_spent"] <= s["epsilon"] + 1e-9 for s in dp["steps"].values())
    assert {k.split(".")[0] for k in dp["steps"]["run"]["epsilon_per_step"]} == {"election", "training"}
    assert [s["step"] for s in result["steps"]] == ["election", "training"]  # no profile, no baselines: private
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["privacy"] == result["privacy"] and saved["trust"]["min_sites"] is None


def test_result_json_and_report_record_privacy_trust_and_participation(site_files, tmp_path):
    from html.parser import HTMLParser

    result = run_job(_job(site_files, tmp_path, **GUARDED))
    assert result["privacy"] == {"secure_aggregation": True, "dp": None}
    assert result["trust"] == {"robust": False, "max_site_share": 0.5, "min_sites": 2, "timeout": 600.0,
                               "min_holders": 2}
    steps = result["participation"]["steps"]
    assert [s["step"] for s in steps] == ["election", "training"]
    assert all(s["sites"] == ["site-1", "site-2", "site-3"] and s["dropped"] == {} for s in steps)
    assert result["participation"]["dropped"] == {}
    assert result["training"]["metrics"]["per_site"] == {}  # only masked sums reached the server

    class Section(HTMLParser):
        inside, text = False, []

        def handle_starttag(self, tag, attrs):
            if tag == "section":
                self.inside = dict(attrs).get("id") == "guarantees"

        def handle_data(self, data):
            if self.inside:
                self.text.append(data)

    page = Section()
    page.feed((tmp_path / "report.html").read_text())
    text = " ".join("".join(page.text).split())
    assert "Secure aggregation: on" in text and "Differential privacy: off" in text
    assert "Quorum" in text and "No site was left out of the run." in text


def _predictions(out: Path, table: pd.DataFrame) -> np.ndarray:
    from fedtab.job.model_file import load_model

    return load_model(out / "model.fedtab").predict_proba(table)


@pytest.fixture(scope="module")
def guarded_runs(site_files, tmp_path_factory) -> dict:
    """The same job with [privacy] and [trust] on the in-process engine and Flower's in-process apps."""
    pytest.importorskip("flwr")
    runs = {}
    for engine in ("local", "flower"):
        out = tmp_path_factory.mktemp(f"guarded_{engine}")
        runs[engine] = (run_job(_job(site_files, out, **GUARDED), engine=engine), out)
    return runs


def _assert_same_model(result: dict, out: Path, ref: dict, ref_out: Path, table: pd.DataFrame) -> None:
    assert result["election"]["selected"] == ref["election"]["selected"]
    np.testing.assert_allclose(_predictions(out, table), _predictions(ref_out, table), atol=1e-6, rtol=0)
    for key in ("privacy", "trust"):
        assert result[key] == ref[key]
    assert [s["sites"] for s in result["participation"]["steps"]] == [
        s["sites"] for s in ref["participation"]["steps"]]


def test_a_guarded_job_gives_the_same_model_on_flower(guarded_runs, site_files):
    table = pd.read_csv(site_files[0]["data-path"])
    ref, ref_out = guarded_runs["local"]
    result, out = guarded_runs["flower"]
    assert result["engine"] == "flower"
    _assert_same_model(result, out, ref, ref_out, table)


@pytest.mark.slow
def test_a_guarded_job_gives_the_same_model_on_the_flare_simulator(guarded_runs, site_files, tmp_path):
    pytest.importorskip("nvflare")
    table = pd.read_csv(site_files[0]["data-path"])
    ref, ref_out = guarded_runs["local"]
    result = run_job(_job(site_files, tmp_path, **GUARDED), engine="nvflare")
    assert result["engine"] == "nvflare"
    _assert_same_model(result, tmp_path, ref, ref_out, table)


# On a real Flower deployment (TLS, registered keys, SuperNodes that know only their table): the
# guarded job's model, privacy, trust and participation equal the in-process engine's in
# tests/engines/test_engine_flower.py::test_tls_auth_deployment_matches_local_engine_and_binds_sites_to_keys.


def test_a_loopback_deployment_runs_the_job_on_its_superlink_with_sites_that_know_only_their_table(
        site_files, tmp_path, monkeypatch):
    """``fedtab run --deployment loopback`` (Flower): the SuperNodes get only their name, table,
    floor, split and their own disclosure policy (a site's ``allow_server_row_sets`` opt-in reaches
    its node, as FLARE loopback's site files carry it; a site that opted in to nothing gets no
    policy); the job goes to the deployment's SuperLink with its CA and key list; the deployment
    is stopped after the run (a stand-in deployment and run: the real ones are tested above)."""
    import fedtab.engines.flower_deploy as flower_deploy
    import fedtab.job.run as job_run
    from fedtab.engines.flower_deploy import supernode_args
    from fedtab.engines.site_config import site_config, site_policy, with_job_settings
    from flwr.common.config import parse_config_args

    seen: dict = {}

    class Deployment:
        def __init__(self, nodes, workdir):
            seen["nodes"], seen["workdir"] = nodes, workdir
            self.address = "127.0.0.1:9999"
            self.keys = type("Keys", (), {"ca_cert": tmp_path / "ca.pem", "site_keys": tmp_path / "keys.json"})()

        def __enter__(self):
            seen["started"] = True
            return self

        def __exit__(self, *exc):
            seen["stopped"] = True

    def on_superlink(spec, plan, link, workdir, progress):
        seen["link"] = link
        assert seen.get("started") and not seen.get("stopped")
        return {"engine": "flower"}

    monkeypatch.setattr(flower_deploy, "LoopbackDeployment", Deployment)
    monkeypatch.setattr(job_run, "_run_on_superlink", on_superlink)
    # the first site opted in to plain answers over server-chosen row sets (JSON text, as site_configs
    # writes it), the second sets its policy as an object, the rest opted in to nothing
    policies = ['{"allow_server_row_sets": true}', {"max_rounds": 7, "allow_server_row_sets": True}]
    configs = [{**c, "min-rows": 5, "selector": "lasso", **({"policy": policies[i]} if i < len(policies) else {})}
               for i, c in enumerate(site_files)]
    assert len(configs) > len(policies)
    spec = load_job(_job(site_files, tmp_path / "out", **GUARDED))
    target = job_run.EngineTarget("flower", "loopback", timeout=123.0)
    raw = job_run._run_engine(spec, target, configs, spec.plan(), lambda _m: None, tmp_path)
    assert raw == {"engine": "flower"} and seen["stopped"]
    # each node knows its name, table, floor, own policy and (fedtab plays its operator here) its own split
    split = ("test-size", "seed", "folds")
    assert [{k: v for k, v in n.items() if k != "policy"} for n in seen["nodes"]] == [
        {"name": c["name"], "data-path": c["data-path"], "min-rows": 5, **{k: c[k] for k in split if k in c}}
        for c in site_files]
    assert all("selector" not in n for n in seen["nodes"])
    assert [n.get("policy") for n in seen["nodes"]] == [
        policies[0], '{"allow_server_row_sets": true, "max_rounds": 7}', *[None] * (len(configs) - 2)]
    # the node's policy survives Flower's --node-config parsing and is the one its site answers under
    # (a job's site-settings cannot set or relax it: with_job_settings refuses a policy key)
    for node, opted in zip(seen["nodes"], [True, True, *[False] * (len(configs) - 2)]):
        argv = supernode_args("127.0.0.1:9999", node, 9100, root_certificates=None, private_key=None)
        parsed = parse_config_args([argv[argv.index("--node-config") + 1]])
        policy = site_policy(site_config(parsed))
        assert policy.allow_server_row_sets is opted and policy.min_rows == 5
        with pytest.raises(ValueError, match="policy"):
            with_job_settings(parsed, {node["name"]: {"policy": '{"allow_server_row_sets": true}'}})
    assert site_policy(site_config(parse_config_args([
        supernode_args("x:1", seen["nodes"][1], 9100, root_certificates=None, private_key=None)[-1]]))).max_rounds == 7
    link = seen["link"]
    assert (link.address, link.root_certificates, link.site_keys, link.timeout) == (
        "127.0.0.1:9999", tmp_path / "ca.pem", tmp_path / "keys.json", 123.0)


def _four_sites(tmp_path: Path) -> list[dict]:
    """Four sites' configs: when one drops, three remain, the fewest peers a site takes part in
    a secure sum with (``min_peers=3``)."""
    _, parts = classification_parts(800, 10, 4, 2, [0.3, 0.25, 0.25, 0.2], seed=7, split_seed=3)
    return write_site_configs(parts, tmp_path)


@pytest.fixture
def a_site_without_the_target(tmp_path) -> list[dict]:
    """Four sites, site-4's table without the target column."""
    configs = _four_sites(tmp_path)
    bad = tmp_path / "site4_relabelled.csv"
    pd.read_csv(configs[3]["data-path"]).rename(columns={"target": "label"}).to_csv(bad, index=False)
    configs[3]["data-path"] = str(bad)
    return configs


#: (mode, engine) pairs: both modes in process and on Flower; FLARE (seconds per simulator start) the
#: secure one, the mode whose exchanges differ
MODES_ON_ENGINES = [("plain", "local"), ("secure", "local"), ("plain", "flower"), ("secure", "flower"),
                    pytest.param("secure", "nvflare", marks=pytest.mark.slow)]


@pytest.mark.parametrize(("mode", "engine"), MODES_ON_ENGINES)
def test_a_site_that_cannot_read_its_table_is_dropped_and_named(a_site_without_the_target, tmp_path, mode, engine):
    if engine != "local":
        pytest.importorskip({"flower": "flwr", "nvflare": "nvflare"}[engine])
    extra = {"privacy": {"secure_aggregation": True}} if mode == "secure" else {}
    result = run_job(_job(a_site_without_the_target, tmp_path, trust={"min_sites": 3}, **extra), engine=engine)
    dropped = result["participation"]["dropped"]
    assert list(dropped) == ["site-4"] and "target column" in dropped["site-4"]
    first = result["participation"]["steps"][0]
    honest = ["site-1", "site-2", "site-3"]
    assert first["dropped"] == dropped and first["sites"] == honest
    assert all(s["sites"] == honest for s in result["participation"]["steps"])
    assert result["training"]["metrics"]["pooled"]["n"] > 0
    assert "site-4" not in result["training"]["metrics"]["per_site"]


def test_without_a_quorum_the_same_site_stops_the_job_naming_it(a_site_without_the_target, tmp_path):
    from fedtab.federation.protocol import SiteError

    with pytest.raises(SiteError, match="site 'site-4'"):
        run_job(_job(a_site_without_the_target, tmp_path))


def _capped_sites(site_files) -> list[dict]:
    """site-3 answers one FedAvg round per run (its policy's max_rounds), then refuses."""
    configs = [dict(c) for c in site_files]
    configs[2]["policy"] = json.dumps({"max_rounds": 1})
    return configs


def _run_capped(site_files, jobs, **extra) -> dict:
    from fedtab.engines.local import LocalFederation
    from fedtab.engines.site_config import build_site
    from fedtab.job.workflow import run_workflow

    plan = jobs.plan(election={}, training={"rounds": 2, "local_epochs": 1}, trust={"min_sites": 2}, **extra)
    return run_workflow(LocalFederation([build_site(c) for c in _capped_sites(site_files)]),
                        spec_from_plan(plan)).result


def test_a_site_whose_handler_refuses_mid_training_is_dropped_in_that_step(site_files, jobs):
    result = _run_capped(site_files, jobs)
    steps = {s["step"]: s for s in result["participation"]["steps"]}
    assert steps["election"]["dropped"] == {} and steps["election"]["sites"] == ["site-1", "site-2", "site-3"]
    assert list(steps["training"]["dropped"]) == ["site-3"] and "max_rounds" in steps["training"]["dropped"]["site-3"]
    assert steps["training"]["sites"] == ["site-1", "site-2"]


def test_a_site_whose_handler_refuses_mid_training_is_dropped_in_secure_mode(tmp_path, jobs):
    """Secure sums keep the quorum: site-4 answers one FedAvg round, then refuses; the three
    others (still ``min_peers=3``) finish the run and site-4 is dropped and named."""
    from fedtab.engines.local import LocalFederation
    from fedtab.engines.site_config import build_site
    from fedtab.job.workflow import run_workflow

    configs = _four_sites(tmp_path)
    configs[3]["policy"] = json.dumps({"max_rounds": 1})
    plan = jobs.plan(election={}, training={"rounds": 2, "local_epochs": 1}, trust={"min_sites": 3},
                     privacy={"secure_aggregation": True})
    result = run_workflow(LocalFederation([build_site(c) for c in configs]), spec_from_plan(plan)).result
    assert list(result["participation"]["dropped"]) == ["site-4"]
    assert "max_rounds" in result["participation"]["dropped"]["site-4"]
    steps = {s["step"]: s for s in result["participation"]["steps"]}
    assert steps["election"]["sites"] == ["site-1", "site-2", "site-3", "site-4"]
    assert steps["training"]["sites"] == ["site-1", "site-2", "site-3"]
    assert result["training"]["metrics"]["pooled"]["n"] > 0 and result["privacy"]["secure_aggregation"]


def test_a_secure_run_left_with_fewer_peers_than_the_sites_accept_stops_saying_why(site_files, jobs):
    """Three sites, one refuses after round 1: the two left would share a secure sum with one
    peer only, which each refuses (``min_peers=3``): the run stops with their reason instead of
    summing what one site could subtract its own update from."""
    from fedtab.federation.protocol import QuorumError

    with pytest.raises(QuorumError, match=r"site 'site-1': refused: secure aggregation over 2 peer\(s\).*min_peers=3"):
        _run_capped(site_files, jobs, privacy={"secure_aggregation": True})
