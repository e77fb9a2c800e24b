"""The program the reservation-end CronJob runs (recipes/reservation_end.py) against a stub of the API
server that answers as Kueue does (no real API server): the quota first, then only the Workloads admitted to the
ending flavor deactivated, reactivated once Kueue has cleared their admission; nothing at a firing that is not the
end's own (a year before it, on the first `pulumi up`, or a year after)."""

from __future__ import annotations

import copy
import datetime
import functools
import sys
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import PROJECT_DIR, load_file, reference
from test_kueue import python_patterns

SCRIPTS = PROJECT_DIR / "recipes"
UTC = datetime.UTC
END = "2030-01-01T00:00:00Z"
Q, FLAVOR, FALLBACK = "deepspeed", "h100-reserved", "h100-dws"


@functools.cache
def program() -> Any:
    sys.path.insert(0, str(SCRIPTS))  # the program imports kube_api beside it, as `python3 FILE` does in the pod
    try:
        return load_file(SCRIPTS / "reservation_end.py", "reservation_end_under_test")
    finally:
        sys.path.remove(str(SCRIPTS))


def _workload(name: str, namespace: str, flavor: str | None, queue: str = Q) -> dict[str, Any]:
    """A Workload as Kueue v0.19.2 writes it for an MPIJob (v1beta2): a launcher and a worker PodSet."""
    pod = {"spec": {"containers": [{"name": "c", "image": "i"}]}}
    wl: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"queueName": queue, "active": True,
                 "podSets": [{"name": "launcher", "count": 1, "template": pod},
                             {"name": "worker", "count": 2, "template": pod}]}}
    if flavor:
        wl["status"] = {"admission": {"clusterQueue": queue, "podSetAssignments": [
            {"name": "launcher", "count": 1, "flavors": {"cpu": "cpu-memory", "memory": "cpu-memory"}},
            {"name": "worker", "count": 2, "flavors": {"nvidia.com/gpu": flavor, "cpu": "cpu-memory",
                                                        "memory": "cpu-memory"}}]}}
    return wl


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 merge patch, as the API server applies it."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict):
            _merge(target.setdefault(k, {}), v)
        else:
            target[k] = v


class FakeKueue:
    """The API server with Kueue's controllers behind it, as far as the program sees them: a deactivated Workload
    loses its admission after `stop_polls` lists (the job's pods stopping; reconciler.go 586-612)."""

    def __init__(self, workloads: list[dict[str, Any]], stop_polls: int = 2):
        self.workloads = {(w["metadata"]["namespace"], w["metadata"]["name"]): w for w in workloads}
        self.stop_polls, self.lists, self.calls = stop_polls, 0, []

    def __call__(self, method: str, path: str, body: Any, content_type: str | None) -> Any:
        self.calls.append((method, path, copy.deepcopy(body), content_type))
        parts = path.strip("/").split("/")
        if method == "GET":
            self.lists += 1
            for w in self.workloads.values():
                if not w["spec"]["active"] and self.lists > self.stop_polls:
                    w.pop("status", None)
            return {"items": [copy.deepcopy(w) for (ns, _), w in sorted(self.workloads.items()) if ns == parts[4]]}
        if parts[3] == "clusterqueues":
            return {}
        _merge(self.workloads[(parts[4], parts[6])], body)
        return {}


def _run(fake: FakeKueue, now: datetime.datetime, namespaces: str = "pretrain,other") -> int:
    p = program()
    args = p.parse_args(["--queue", Q, "--flavor", FLAVOR, "--index", "0", "--end", END, "--namespaces", namespaces,
                         "--wait-seconds", "600", "--poll-seconds", "5"])
    clock = iter(range(0, 100000, 5))
    return p.run(p.Api(fake), args, now, sleep=lambda s: None, clock=lambda: float(next(clock)))


def _patches(fake: FakeKueue) -> list[tuple[str, Any]]:
    return [(path, body) for method, path, body, _ in fake.calls if method == "PATCH"]


WL = "/apis/kueue.x-k8s.io/v1beta2/namespaces"


def test_at_the_end_only_the_jobs_on_the_flavor_are_requeued() -> None:
    fake = FakeKueue([_workload("mpijob-pretrain-a1b2c", "pretrain", FLAVOR),
                      _workload("mpijob-other-d3e4f", "other", FALLBACK),  # already on DWS: left running
                      _workload("mpijob-queued-0a0a0", "pretrain", None)])  # not admitted: nothing to move
    assert _run(fake, datetime.datetime(2030, 1, 1, 0, 0, 4, tzinfo=UTC)) == 0
    patches = _patches(fake)
    assert patches[0] == ("/apis/kueue.x-k8s.io/v1beta2/clusterqueues/deepspeed", [
        {"op": "test", "path": "/spec/resourceGroups/0/flavors/0/name", "value": FLAVOR},
        {"op": "replace", "path": "/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota", "value": 0}])
    assert fake.calls[0][3] == "application/json-patch+json"
    assert patches[1:] == [
        (f"{WL}/pretrain/workloads/mpijob-pretrain-a1b2c",
         {"metadata": {"annotations": {"deepspeed-stack/reservation-end": FLAVOR}}, "spec": {"active": False}}),
        (f"{WL}/pretrain/workloads/mpijob-pretrain-a1b2c",
         {"metadata": {"annotations": {"deepspeed-stack/reservation-end": None}}, "spec": {"active": True}})]
    # Reactivated only after Kueue cleared its admission (2 lists later), not before its eviction.
    reactivate = [i for i, c in enumerate(fake.calls) if isinstance(c[2], dict) and c[2]["spec"]["active"]]
    assert sum(1 for c in fake.calls[:reactivate[0]] if c[0] == "GET") == 2 * 2  # two namespaces, 2 rounds
    moved = fake.workloads[("pretrain", "mpijob-pretrain-a1b2c")]
    assert moved["spec"]["active"] is True and moved["metadata"]["annotations"] == {}
    assert fake.workloads[("other", "mpijob-other-d3e4f")]["spec"]["active"] is True


def test_a_retry_reactivates_what_the_killed_run_deactivated() -> None:
    left = _workload("mpijob-pretrain-a1b2c", "pretrain", None)  # deactivated, admission cleared, never reactivated
    left["spec"]["active"] = False
    left["metadata"]["annotations"] = {"deepspeed-stack/reservation-end": FLAVOR}
    fake = FakeKueue([left, _workload("mpijob-manual-99999", "pretrain", None)])
    fake.workloads[("pretrain", "mpijob-manual-99999")]["spec"]["active"] = False  # someone else's: left alone
    assert _run(fake, datetime.datetime(2030, 1, 1, 0, 3, tzinfo=UTC), namespaces="pretrain") == 0
    assert [p for p, b in _patches(fake)[1:]] == [f"{WL}/pretrain/workloads/mpijob-pretrain-a1b2c"]
    assert fake.workloads[("pretrain", "mpijob-pretrain-a1b2c")]["spec"]["active"] is True
    assert fake.workloads[("pretrain", "mpijob-manual-99999")]["spec"]["active"] is False


def test_reactivates_after_the_wait_even_if_the_job_is_slow_to_stop() -> None:
    fake = FakeKueue([_workload("mpijob-pretrain-a1b2c", "pretrain", FLAVOR)], stop_polls=10**6)
    assert _run(fake, datetime.datetime(2030, 1, 1, 0, 0, tzinfo=UTC), namespaces="pretrain") == 0
    # 600 s of waiting at 5 s a poll, then the reactivation (safe once evicted: workload_controller.go 641-646).
    assert 100 <= sum(1 for c in fake.calls if c[0] == "GET") <= 122
    assert _patches(fake)[-1][1]["spec"] == {"active": True}


@pytest.mark.parametrize(("year", "acts"), [(2026, False), (2027, False), (2029, False), (2030, True), (2031, False),
                                            (2032, False)])
def test_the_yearly_schedule_acts_only_at_the_end(year: int, acts: bool) -> None:
    """`0 0 1 1 *` fires every 1 January: created by the first `pulumi up` in 2026, it fires in 2027, 2028 and 2029
    before the end, and every year after it. Only the end's own firing may move anything."""
    fake = FakeKueue([_workload("mpijob-pretrain-a1b2c", "pretrain", FLAVOR)])
    assert _run(fake, datetime.datetime(year, 1, 1, 0, 0, 2, tzinfo=UTC), namespaces="pretrain") == 0
    assert bool(fake.calls) is acts
    assert fake.workloads[("pretrain", "mpijob-pretrain-a1b2c")]["spec"]["active"] is True


def test_due_window() -> None:
    p = program()
    end = datetime.datetime(2030, 1, 1, tzinfo=UTC)
    week = datetime.timedelta(days=7)
    assert not p.due(end - datetime.timedelta(minutes=2), end, week)
    assert p.due(end - datetime.timedelta(seconds=30), end, week)  # clock skew between node and schedule
    assert p.due(end + datetime.timedelta(hours=23), end, week)  # startingDeadlineSeconds: up to a day late
    assert not p.due(end + week, end, week)


def test_a_changed_cluster_queue_stops_the_run() -> None:
    """The JSON patch's `test` fails (HTTP 422) when the flavor is not at its index: nothing is deactivated."""
    p = program()

    def send(method: str, path: str, body: Any, content_type: str | None) -> Any:
        if method == "PATCH" and "clusterqueues" in path:
            raise p.ApiError(422, "the server rejected our request due to an error in our request")
        raise AssertionError(f"no request after the failed patch: {method} {path}")

    args = p.parse_args(["--queue", Q, "--flavor", FLAVOR, "--index", "0", "--end", END, "--namespaces", "pretrain"])
    with pytest.raises(p.ApiError, match="422"):
        p.run(p.Api(send), args, datetime.datetime(2030, 1, 1, tzinfo=UTC))


@functools.cache
def _workload_schema() -> dict[str, Any]:
    path = reference("gke-gpu-fabric", "kueue-v0.19.2", "crd", "kueue.x-k8s.io_workloads.yaml")
    with open(path, encoding="utf-8") as fh:
        crd = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta2"]
    return python_patterns(served["schema"]["openAPIV3Schema"])


def test_the_workload_patches_match_the_crd() -> None:
    """Each merge patch the program sends, applied to a Workload as Kueue writes it, is a valid v1beta2 Workload
    (spec.active is the CRD's boolean; the program reads status.admission's clusterQueue and flavors)."""
    fake = FakeKueue([_workload("mpijob-pretrain-a1b2c", "pretrain", FLAVOR)], stop_polls=10**6)
    schema = _workload_schema()
    assert schema["properties"]["spec"]["properties"]["active"]["type"] == "boolean"
    before = copy.deepcopy(fake.workloads[("pretrain", "mpijob-pretrain-a1b2c")])
    assert list(jsonschema.Draft7Validator(schema).iter_errors(before)) == []
    _run(fake, datetime.datetime(2030, 1, 1, tzinfo=UTC), namespaces="pretrain")
    for _, body in _patches(fake)[1:]:
        after = copy.deepcopy(before)
        _merge(after, body)
        assert [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(after)] == []
    admission = schema["properties"]["status"]["properties"]["admission"]["properties"]
    assert {"clusterQueue", "podSetAssignments"} <= set(admission)
    assert "flavors" in admission["podSetAssignments"]["items"]["properties"]


def test_the_in_cluster_request(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """What reaches the API server: the token read at each request (the kubelet rotates it), the CA bundle, the
    service's address, the patch's content type; an HTTP error becomes ApiError with its status."""
    import io
    import ssl
    import urllib.error
    import urllib.request

    api = load_file(SCRIPTS / "kube_api.py", "kube_api_under_test")
    (tmp_path / "token").write_text("t1\n")
    (tmp_path / "ca.crt").write_text("")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(ssl, "create_default_context", lambda cafile: ("ctx", cafile))
    seen: list[Any] = []

    def urlopen(req: urllib.request.Request, context: Any, timeout: float) -> Any:
        seen.append((req.full_url, req.get_method(), dict(req.header_items()), req.data, context))
        if req.get_method() == "POST":
            raise urllib.error.HTTPError(req.full_url, 429, "Too Many Requests", {}, io.BytesIO(b"budget"))  # type: ignore[arg-type]
        return io.BytesIO(b'{"ok": true}')

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    client = api.Api(api.in_cluster_send(account=tmp_path))
    assert client.patch("/apis/x/v1/things/a", [{"op": "test"}], api.JSON_PATCH) == {"ok": True}
    (tmp_path / "token").write_text("t2\n")
    assert client.get("/api/v1/nodes/n") == {"ok": True}
    with pytest.raises(api.ApiError) as err:
        client.create("/api/v1/namespaces/ns/pods/p/eviction", {})
    assert err.value.status == 429
    (url, method, headers, data, context), (_, _, second, _, _) = seen[:2]
    assert (url, method, data) == ("https://10.0.0.1:443/apis/x/v1/things/a", "PATCH", b'[{"op": "test"}]')
    assert headers["Authorization"] == "Bearer t1" and second["Authorization"] == "Bearer t2"
    assert headers["Content-type"] == "application/json-patch+json" and context == ("ctx", str(tmp_path / "ca.crt"))
