"""Submitting to a FLARE project waits for the job's sites to connect (a job submitted before its
clients registered ends FAILED_TO_RUN at once), and names the sites that never do."""

from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.requires("nvflare")


class _Session:
    """A stand-in for FLARE's admin Session: the clients connect one per status query."""

    def __init__(self, names, fail_first=0):
        self.names, self.calls, self.fail_first = list(names), 0, fail_first

    def get_connected_client_list(self):
        self.calls += 1
        if self.calls <= self.fail_first:
            raise ConnectionError("server not ready")
        return [SimpleNamespace(name=n) for n in self.names[: self.calls - self.fail_first]]


def test_waits_until_every_site_is_connected():
    from fedtab.engines.nvflare_remote import _wait_for_sites

    session = _Session(["a", "b", "c"], fail_first=1)
    _wait_for_sites(session, ["c", "a", "b"], timeout=30)
    assert session.calls == 4  # one refused query, then a, a+b, a+b+c


def test_names_the_sites_that_never_connect():
    from fedtab.engines.errors import RunError
    from fedtab.engines.nvflare_remote import _wait_for_sites

    with pytest.raises(RunError, match=r"FLARE sites \['va'\] are not connected"):
        _wait_for_sites(_Session(["cleveland", "hungarian"]), ["cleveland", "hungarian", "va"], timeout=1.0)


class _Waiting:
    """A stand-in Session whose wait is interrupted (Ctrl-C) or times out; records aborts."""

    def __init__(self, error):
        self.error, self.aborted = error, []

    def wait_for_job(self, job_id, timeout, poll_interval):
        raise self.error

    def abort_job(self, job_id):
        self.aborted.append(job_id)


def test_a_job_interrupted_or_past_its_timeout_is_aborted_on_the_server():
    from nvflare.fuel.flare_api.api_spec import JobTimeout

    from fedtab.engines.errors import RunError
    from fedtab.engines.nvflare_remote import _wait

    session = _Waiting(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        _wait(session, "job-1", timeout=60)
    assert session.aborted == ["job-1"]
    session = _Waiting(JobTimeout("late"))
    with pytest.raises(RunError, match="did not finish within 60 s \\(aborted\\)"):
        _wait(session, "job-2", timeout=60)
    assert session.aborted == ["job-2"]
