"""``run_job``'s deployment keywords (issue 29, item 5): ``root_certificates``, ``insecure``,
``site_keys``, ``timeout`` and ``attach`` travel as one :class:`Connection`, the engine choice is
resolved and checked once into an :class:`EngineTarget`; the keywords and messages are as before."""

import pytest

from fedtab.job import JobError
from fedtab.job.run import Connection, EngineTarget, SuperLink, _engine_target, run_job
from fedtab.job.spec import load_job

JOB = 'target = "y"\n[sites.a]\n[sites.b]\n[training]\n'


@pytest.fixture
def spec(tmp_path):
    (tmp_path / "job.toml").write_text(JOB)
    return load_job(str(tmp_path / "job.toml"))


def test_an_unknown_keyword_is_refused_before_the_job_is_read(tmp_path):
    with pytest.raises(TypeError, match="run_job\\(\\) got an unexpected keyword argument 'timout'"):
        run_job(str(tmp_path / "no-such-job.toml"), timout=5)


def test_a_superlink_address_takes_the_connection_settings(spec):
    conn = Connection.of({"root_certificates": "ca.pem", "site_keys": {"a": "k"}, "timeout": 9.0, "attach": 4})
    target = _engine_target(spec, None, None, "127.0.0.1:9093", None, conn)
    assert target == EngineTarget("flower", None, SuperLink("127.0.0.1:9093", "ca.pem", False, {"a": "k"}, 9.0, 4),
                                  None, 9.0)


def test_the_engine_defaults_follow_the_deployment(spec):
    conn = Connection()
    assert _engine_target(spec, None, None, None, "kit", conn).engine == "nvflare"
    assert _engine_target(spec, None, "loopback", None, None, conn).engine == "flower"  # the job's "local" on a deployment
    assert _engine_target(spec, None, None, None, None, conn) == EngineTarget(spec.run.engine)


@pytest.mark.parametrize(("args", "message"), [
    (("nvflare", None, "127.0.0.1:9", None), "superlink applies to engine 'flower' without another deployment"),
    (("flower", None, None, "kit"), "flare_project applies to engine 'nvflare' without another deployment"),
    (("local", "loopback", None, None), "deployment 'loopback' applies to engines 'flower' and 'nvflare'"),
    (("spark", None, None, None), "unknown engine 'spark'"),
])
def test_a_target_that_does_not_fit_the_engine_is_refused(spec, args, message):
    with pytest.raises(JobError, match=message):
        _engine_target(spec, *args, Connection())


def test_attach_needs_the_superlink_that_carries_it(spec):
    with pytest.raises(JobError, match="attach"):
        _engine_target(spec, None, None, SuperLink("127.0.0.1:9"), None, Connection(attach=3))
