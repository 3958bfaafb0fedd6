"""fedtab on Flower 1.42: the real ServerApp/ClientApp in one process, and a loopback deployment.

The deployment tests start a SuperLink with TLS and SuperNode authentication and one
authenticated SuperNode per site on 127.0.0.1 (one deployment for the module), ``flwr
run`` the app and compare the elected mask and the trained model with the in-process
engine's; a node that claims another site's name and
one that trusts another CA must be kept out (an unregistered key: the guide's loopback test).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedtab.engines import flower  # noqa: E402
from fedtab.federation.protocol.messages import Message  # noqa: E402
from tests.builders import write_classification_sites

#: the job the tests run: an election and two rounds of training (as sections of a job plan)
JOB = {"election": {"freedom_degree": 0.5}, "training": {"rounds": 2, "local_epochs": 2}}
# fewer steps for the deployment, where every step costs seconds (a ClientApp process per message)
DEPLOY_JOB = {**JOB, "training": {"rounds": 1, "local_epochs": 2}}
#: the deployment's job carries the job file's guarantees: secure sums among the verified sites, a quorum
GUARDED_DEPLOY_JOB = {**DEPLOY_JOB, "privacy": {"secure_aggregation": True},
                      "trust": {"min_sites": 2, "timeout": 600, "min_holders": 2}}
IMPUTE_JOB = {"target": None, "training": None,
              "impute": {"rounds": 2, "local_epochs": 1, "hidden_dim": 8, "n_layers": 1, "n_threads": 1}}


@pytest.fixture(scope="module")
def site_configs(tmp_path_factory) -> list[dict]:
    return write_classification_sites(tmp_path_factory.mktemp("flower_sites"), 900, 30, 6, 4, table_seed=3, split_seed=0)


@pytest.fixture(scope="module")
def reference(site_configs, jobs) -> dict:
    return jobs.local(site_configs, jobs.plan(**JOB))


def _assert_same(result: dict, ref: dict) -> None:
    assert result["election"]["selected"] == ref["election"]["selected"]
    assert result["election"]["mask"] == ref["election"]["mask"]
    assert result["training"]["features"] == ref["training"]["features"]
    for key, value in ref["model"]["params"].items():
        np.testing.assert_allclose(result["model"]["params"][key], value, rtol=1e-9, atol=1e-12)
    assert result["training"]["metrics"]["pooled"]["weighted_f1"] == pytest.approx(
        ref["training"]["metrics"]["pooled"]["weighted_f1"], abs=1e-12)


def test_the_flower_app_declares_exactly_the_run_config_keys(jobs):
    """``flwr run --run-config`` (Flower's ``fuse_dicts``) rejects keys the app does not declare: the app
    declares the job plan and the engine's own keys, nothing else (every setting travels in the plan);
    a job given through an override parses back into the same JobSpec."""
    import json
    import tomllib

    from flwr.common.config import fuse_dicts

    from fedtab.job.spec import spec_from_plan

    declared = tomllib.loads((flower.app_dir() / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert set(declared) == set(flower.RUN_CONFIG_KEYS)
    plan = jobs.plan(election={"compat": "nvflare", "freedom_degree": 0.3},
                     trust={"robust": True, "max_site_share": 0.4, "min_holders": 3})
    cfg = fuse_dicts(declared, {"job": json.dumps(plan)})
    spec = spec_from_plan(cfg["job"])
    assert (spec.election.compat, spec.trust.robust, spec.trust.max_site_share, spec.trust.min_holders) == (
        "nvflare", True, 0.4, 3)
    assert spec.plan() == plan


def test_the_server_app_pulls_replies_at_the_run_configs_poll_interval(site_configs):
    """``poll-interval`` reaches the federation (default 0.05 s, not Grid.send_and_receive's 3 s);
    a value outside 0.001-10 s or not a number is refused in one line."""
    app = flower.make_server_app(lambda fed, cfg: {"poll": fed.poll_interval})
    assert flower.run_in_process(site_configs, {}, app=app)["poll"] == 0.05
    assert flower.run_in_process(site_configs, {"poll-interval": 0.2}, app=app)["poll"] == 0.2
    for bad in (0, 60, "soon"):
        with pytest.raises(flower.FederationError, match="poll-interval"):
            flower.run_in_process(site_configs, {"poll-interval": bad}, app=app)


def test_records_round_trip_without_pickle():
    msg = Message("ballot", {"mask": np.array([True, False]), "scores": np.arange(3.0), "names": np.array(["a", "b"])},
                  {"n_samples": 7, "nested": {"x": [1, 2]}})
    back = flower.from_records(flower.to_records(msg))
    assert back.kind == "ballot" and back.meta == msg.meta
    for k, v in msg.arrays.items():
        np.testing.assert_array_equal(back.arrays[k], v)
        assert back.arrays[k].dtype == v.dtype


def test_in_process_server_and_client_apps_match_local_engine(site_configs, reference, jobs):
    # fresh_processes: the live-site cache is cleared before every message, so the
    # elected mask and training setup must survive in Flower's Context.state.
    result = flower.run_in_process(site_configs, jobs.config(jobs.plan(**JOB)), fresh_processes=True)
    assert result["engine"] == "flower"
    assert list(result["sites"]) == ["site-1", "site-2", "site-3"]
    assert 0 < result["election"]["kept"] < 30
    _assert_same(result, reference)


def test_in_process_site_failure_is_named(site_configs, jobs):
    broken = [dict(c) for c in site_configs]
    broken[1]["data-path"] = "/nonexistent/site2.csv"
    with pytest.raises(Exception, match="site-2|site2"):
        flower.run_in_process(broken, jobs.config(jobs.plan(**JOB)))


def test_a_run_config_without_a_job_is_refused_in_one_line(site_configs):
    from fedtab.job.apps import SERVER_APP
    from fedtab.job.spec import JobError

    with pytest.raises(JobError, match="the run config needs job ="):
        flower.run_in_process(site_configs, {"server-app": SERVER_APP})


def test_the_server_app_runs_only_what_its_run_config_names(site_configs, jobs):
    """The ServerApp imports no job: without ``server-app`` it refuses the run in one line, before any
    node is asked; a name that is no declared server app (the job's own step loop, a stdlib function)
    is refused the same way — a run config cannot make the server call an arbitrary function."""
    plan = jobs.config(jobs.plan(**JOB))
    for name, why in ((None, "is missing"), ("", "is missing"), ("os:system", "must be 'fedtab."),
                      ("fedtab.__main__:main", "must be 'fedtab."),
                      ("fedtab.job.workflow:engine_workflow", "is not a server app")):
        cfg = {k: v for k, v in plan.items() if k != "server-app"}
        if name is not None:
            cfg["server-app"] = name
        with pytest.raises(flower.FederationError, match=f"run config 'server-app'.*{why}"):
            flower.run_in_process(site_configs, cfg)


def test_the_jobs_server_app_prints_its_progress_when_the_run_config_asks(site_configs, jobs, capsys):
    """``result-log``: the job's server app gets the ServerApp's ``emit`` and prints the plan's count,
    then one line per exchange with the training rounds (what ``fedtab run --superlink`` follows)."""
    from fedtab.engines.progress import parse_event

    plan = jobs.plan(**JOB)
    result = flower.run_in_process(site_configs, jobs.config(plan, **{"result-log": True}))
    events = [e for line in capsys.readouterr().out.splitlines() if (e := parse_event(line)) is not None]
    assert events[0]["asked"] == 3 and events[0]["exchanges"] > 0
    rounds = [(e["round"], e["rounds"]) for e in events if e.get("kind") == "newton"]  # logistic: Newton rounds
    assert rounds and rounds[-1][0] == len(rounds) and {r for _, r in rounds} == {2}
    assert len([e for e in events if "kind" in e]) == len(result["exchanges"])


def test_in_process_tuning_then_election_matches_local_engine(site_configs, jobs):
    plan = jobs.plan(election={"tune": "grid", "grid": [0.0, 0.5, 1.0]}, training={"rounds": 1, "local_epochs": 1})
    ref = jobs.local(site_configs, plan)
    result = flower.run_in_process(site_configs, jobs.config(plan), fresh_processes=True)
    assert result["tuning"]["freedom_degree"] == ref["tuning"]["freedom_degree"]
    assert result["tuning"]["selected"] == ref["tuning"]["selected"]
    assert result["election"]["selected"] == ref["election"]["selected"]
    assert result["training"]["metrics"]["pooled"]["weighted_f1"] == pytest.approx(
        ref["training"]["metrics"]["pooled"]["weighted_f1"], abs=1e-12)


def test_in_process_imputation_matches_local_engine(tmp_path, imputation_site_configs, jobs):
    pytest.importorskip("torch")
    configs = imputation_site_configs
    plan = jobs.plan(**IMPUTE_JOB)
    ref = jobs.local(configs, plan)
    # as on a SuperNode, every message meets a fresh process: the imputer's model, Adam
    # moments and random state must come back from Context.state (arrays + JSON only)
    result = flower.run_in_process(configs, jobs.config(plan), fresh_processes=True)
    _assert_same_imputation(result, ref)


def _assert_same_imputation(result: dict, ref: dict) -> None:
    assert result["imputation"]["columns"] == ref["imputation"]["columns"]
    got_curve, want_curve = result["imputation"]["training_curve"], ref["imputation"]["training_curve"]
    assert [h["round"] for h in got_curve] == [h["round"] for h in want_curve]
    for got, want in zip(got_curve, want_curve):
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-5)
    assert result["imputation"]["validation"]["overall"] == pytest.approx(ref["imputation"]["validation"]["overall"],
                                                                         rel=1e-5)


def _flower_binaries() -> bool:
    bin_dir = Path(os.sys.executable).parent
    return all((bin_dir / b).exists() or shutil.which(b) for b in ("flower-superlink", "flower-supernode", "flwr"))


needs_flower_cli = pytest.mark.skipif(not _flower_binaries(), reason="Flower CLI binaries not installed")


@pytest.fixture(scope="module")
def tls_deployment(site_configs, tmp_path_factory):
    """TLS + auth deployment of the three sites, plus an intruder: a consortium member's
    node (key of site-4, registered) that declares itself ``site-2``."""
    from fedtab.deploy.keys import write_consortium_keys
    from fedtab.engines.flower_deploy import LoopbackDeployment

    workdir = tmp_path_factory.mktemp("tls_deployment")
    keys = write_consortium_keys(workdir / "keys", ["site-1", "site-2", "site-3", "site-4"])
    dep = LoopbackDeployment(site_configs, workdir, start_timeout=300, keys=keys)
    try:
        dep.start()
        dep.node_ids.update(dep.register(["site-4"]))
        dep.add_supernode({**site_configs[1], "name": "site-2"}, private_key=keys.site_private["site-4"],
                          name="intruder")
        yield dep
    finally:
        dep.stop()
        leftovers = dep._stragglers()
        assert not leftovers, f"processes left running: {leftovers}"


def _refused(dep, name: str, timeout: float = 45.0, **node) -> str:
    """Start SuperNode ``name`` (``node``: its key / root certificates), wait (bounded) for
    it to give up, return its log. Fails if it is still running: it was let in."""
    import subprocess

    proc = dep.add_supernode({"name": name, "data-path": "/nonexistent.csv"}, name=name, wait=False, **node)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"SuperNode {name} still connected after {timeout:g} s: it was not refused")
    assert code != 0
    return (dep.workdir / f"{name}.log").read_text()


# A SuperNode whose key is not registered is refused (it exits with status 1):
# tests/engines/test_flower_guide_loopback.py::test_a_supernode_with_an_unregistered_key_exits_with_status_1


@pytest.mark.slow
@needs_flower_cli
def test_tls_refuses_supernode_of_another_ca(tls_deployment, tmp_path):
    """TLS is verified against the consortium's CA only: a SuperNode holding a registered
    key but trusting another CA cannot talk to this SuperLink's certificate, exactly as a
    genuine SuperNode refuses a SuperLink impostor whose certificate another CA signed.
    (Flower 1.42 has no client certificates, ``require_client_auth=False``: a SuperNode
    proves who it is with its registered key, tested above.)"""
    from fedtab.deploy.keys import write_consortium_keys

    other = write_consortium_keys(tmp_path / "other", ["site-1"])
    log = _refused(tls_deployment, "other-ca", root_certificates=other.ca_cert,
                   private_key=tls_deployment.keys.site_private["site-3"])
    assert "CERTIFICATE_VERIFY_FAILED" in log


@pytest.mark.slow
@needs_flower_cli
def test_tls_auth_deployment_matches_local_engine_and_binds_sites_to_keys(tls_deployment, site_configs, jobs):
    """A job with [privacy] and [trust] on real SuperNodes (TLS, keys registered, each site's
    secure-aggregation identity from its operator's config): the in-process engine's model,
    privacy, trust and participation records; the intruder is named and left out."""
    dep = tls_deployment
    plan = jobs.plan(**GUARDED_DEPLOY_JOB)
    reference = jobs.local(site_configs, plan)
    result = dep.run(jobs.config(plan), timeout=600)  # bounded; generous for a 2-core box shared with other jobs
    assert result["engine"] == "flower" and result["identity"] == "key"
    assert list(result["sites"]) == ["site-1", "site-2", "site-3"]
    _assert_same(result, reference)
    assert result["privacy"]["secure_aggregation"] and result["privacy"] == reference["privacy"]
    assert result["trust"] == reference["trust"]
    assert [s["sites"] for s in result["participation"]["steps"]] == [
        s["sites"] for s in reference["participation"]["steps"]]
    # the intruder authenticated with site-4's key but declared site-2: named, left out
    intruder = str(dep.node_ids["site-4"])
    assert list(result["excluded_nodes"]) == [intruder]
    assert "claims site 'site-2'" in result["excluded_nodes"][intruder]
    assert "'site-4'" in result["excluded_nodes"][intruder]


# FedHF-Impute with a fresh ClientApp process per message is test_in_process_imputation_matches_local_engine
# (fresh_processes=True: each message restores the site's state from its record, as a SuperNode's ClientApp
# does) and the FLARE simulator's separate client processes (tests/job/test_job.py, every engine); the
# deployment transport itself is checked by the TLS, guide, kill and guarded-job deployments.


def test_config_strings_survive_flowers_key_value_parser():
    from flwr.common.config import parse_config_args

    from fedtab.engines.flower_deploy import _toml_value

    cfg = {"job": '{"impute": {"hidden_dim": 8, "n_layers": 1}}', "data-path": "/tmp/a b/site.csv",
           "note": "it's", "rounds": 3, "fd": 0.5, "flag": True}
    line = " ".join(f"{k}={_toml_value(v)}" for k, v in cfg.items())
    assert parse_config_args([line]) == cfg
    with pytest.raises(ValueError, match="cannot carry"):
        _toml_value("""both ' and " quotes""")


def test_auth_site_identity_comes_from_the_key_not_the_declared_name(site_configs, reference, tmp_path, jobs):
    """In process, with the keys a SuperLink with SuperNode auth would report: a member's
    node declaring another site's name and a node with an unknown key are named in
    ``excluded_nodes`` and left out; the three genuine sites run as without them."""
    import json

    from fedtab.deploy.keys import write_consortium_keys

    keys = write_consortium_keys(tmp_path, ["site-1", "site-2", "site-3", "site-4", "outsider"])
    pem = {s: _pem(keys.site_public[s]) for s in keys.site_public}
    member_keys = {s: fp for s, fp in keys.fingerprints().items() if s != "outsider"}
    # the impostors come first, so they answer the site-naming hello before the genuine site-2
    nodes = [{**site_configs[1], "name": "site-2"}, {**site_configs[0], "name": "site-1"}, *site_configs]
    node_keys = [pem["site-4"], pem["outsider"], pem["site-1"], pem["site-2"], pem["site-3"]]
    result = flower.run_in_process(nodes, jobs.config(jobs.plan(**JOB), **{"min-sites": 3,
                                                                             "site-keys": json.dumps(member_keys)}),
                                   public_keys=node_keys)
    assert result["identity"] == "key"
    assert list(result["sites"]) == ["site-1", "site-2", "site-3"]
    assert result["excluded_nodes"] == {
        "1000": "claims site 'site-2' but authenticated with the key of site 'site-4'",
        "1001": f"its key {keys.fingerprints()['outsider']} belongs to no site of this consortium"}
    _assert_same(result, reference)


def test_auth_swapped_keys_are_excluded_never_renamed(site_configs, jobs):
    """Keys swapped between two sites: both nodes are excluded with the reason (never
    silently taken for the other site) and the remaining site still runs."""
    import json

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from fedtab.deploy.keys import fingerprint

    pub = [ec.generate_private_key(ec.SECP384R1()).public_key() for _ in site_configs]
    pem = [k.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo) for k in pub]
    swapped = {"site-1": fingerprint(pub[1]), "site-2": fingerprint(pub[0]), "site-3": fingerprint(pub[2])}
    plan = jobs.plan(election={}, training=None)
    result = flower.run_in_process(site_configs, jobs.config(plan, **{"min-sites": 1, "site-keys": json.dumps(swapped)}),
                                   public_keys=pem)
    assert list(result["sites"]) == ["site-3"]
    assert result["excluded_nodes"] == {
        "1000": "claims site 'site-1' but authenticated with the key of site 'site-2'",
        "1001": "claims site 'site-2' but authenticated with the key of site 'site-1'"}


def _pem(openssh_pub: Path) -> bytes:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_public_key(openssh_pub.read_bytes())
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
