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
    """A stand-in Session: the job runs for ``polls`` status polls, its server stats hold progress
    lines (one forged), or the wait is interrupted (Ctrl-C) or times out; records aborts."""

    def __init__(self, error=None, polls=3):
        self.error, self.aborted, self.polls = error, [], polls

    def monitor_job_and_return_job_meta(self, job_id, timeout, poll_interval, cb):
        from nvflare.fuel.flare_api.api_spec import MonitorReturnCode

        if self.error == "timeout":
            return MonitorReturnCode.TIMEOUT, None
        if self.error is not None:
            raise self.error
        for i in range(self.polls):
            self.shown = i + 1
            cb(self, job_id, {"status": "RUNNING"})
        return MonitorReturnCode.JOB_FINISHED, {"status": "FINISHED:COMPLETED"}

    def show_stats(self, job_id, target):
        from fedtab.engines.progress import MARKER

        lines = [f'{MARKER} {{"seq": {i}, "step": "training", "kind": "fit", "round": {i}, "rounds": 2, '
                 f'"answered": 3, "asked": 3}}' for i in range(1, self.shown + 1) if i <= 2]
        lines.append(f'{MARKER} {{"seq": 9, "step": "x", "kind": "y", "answered": "all"}}')  # malformed: dropped
        return {"server": {"fedtab": {"fedtab_progress": lines}, "ServerRunner": {"status": "started"}}}

    def abort_job(self, job_id):
        self.aborted.append(job_id)


def test_a_flare_jobs_progress_lines_arrive_once_each_from_the_servers_stats():
    from fedtab.engines.nvflare_remote import _wait

    said = []
    assert _wait(_Waiting(polls=3), "job-0", timeout=60, progress=said.append)["status"] == "FINISHED:COMPLETED"
    assert said == ["training round 1/2 (3/3 sites)", "training round 2/2 (3/3 sites)"]


def test_a_job_interrupted_or_past_its_timeout_is_aborted_on_the_server():
    from fedtab.engines.errors import RunError
    from fedtab.engines.nvflare_remote import _wait

    session = _Waiting(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        _wait(session, "job-1", timeout=60)
    assert session.aborted == ["job-1"]
    session = _Waiting("timeout")
    with pytest.raises(RunError, match="did not finish within 60 s \\(aborted\\)"):
        _wait(session, "job-2", timeout=60)
    assert session.aborted == ["job-2"]


class _Dropping(_Waiting):
    """A stand-in Session whose first ``drops`` monitoring calls lose the admin connection."""

    def __init__(self, drops):
        super().__init__(polls=2)
        self.drops, self.calls = drops, 0

    def monitor_job_and_return_job_meta(self, job_id, timeout, poll_interval, cb):
        self.calls += 1
        if self.calls <= self.drops:
            raise ConnectionError("cannot connect to server: ERROR_SERVER_CONNECTION")
        return super().monitor_job_and_return_job_meta(job_id, timeout, poll_interval, cb)


def test_a_dropped_admin_connection_is_retried_and_the_job_is_never_aborted_for_it(monkeypatch):
    """A busy FLARE server can drop one status query: the wait reconnects (the job runs on at the
    server) and gives up, naming the job, only after MONITOR_RETRIES drops."""
    from fedtab.engines import nvflare_remote
    from fedtab.engines.errors import RunError

    monkeypatch.setattr(nvflare_remote.time, "sleep", lambda s: None)
    session = _Dropping(drops=2)
    assert nvflare_remote._wait(session, "job-3", timeout=60)["status"] == "FINISHED:COMPLETED"
    assert session.calls == 3 and session.aborted == []
    session = _Dropping(drops=nvflare_remote.MONITOR_RETRIES + 1)
    with pytest.raises(RunError, match=r"lost the FLARE admin connection while job job-4 ran \(6 time"):
        nvflare_remote._wait(session, "job-4", timeout=60)
    assert session.calls == nvflare_remote.MONITOR_RETRIES + 1 and session.aborted == []
