"""The HTTP API: auth, codes, override, state, metrics, and a schemathesis fuzz run."""

from __future__ import annotations

import json
import sqlite3

import pytest
from _fuse_support import FIXTURES, PEOPLE, TOKEN, alert, dry_run_service, fuse_client, payload
from fastapi.testclient import TestClient

from fusebox import conventions as C
from fusebox.fuse.http.app import create_app
from fusebox.fuse.tokens import Tokens

AUTH = {"Authorization": f"Bearer {TOKEN}"}  # the webhook token (Alertmanager)
PERSON = {"Authorization": f"Bearer {PEOPLE['alice']}"}  # an override token
TOKENS = Tokens(webhook=TOKEN, people=dict(PEOPLE))
GPU = {"cluster": "a", "hw_id": "GPU-1"}


@pytest.fixture
def client(svc):
    return fuse_client(svc, max_body=64 * 1024)


def test_firing_critical_alert_trips_and_state_shows_the_level(client, svc):
    r = client.post("/alertmanager", json=payload(alert("GPUMemoryUtilizationHigh", **GPU)), headers=AUTH)
    assert r.status_code == 200
    assert [d["state"] for d in r.json()["decisions"]] == ["trip"]
    assert client.get("/state", headers=AUTH).json()["levels"] == {'{cluster="a",hw_id="GPU-1"}': 1}
    audit = svc.store.audit_log(kinds=("trip",))
    assert [(a["level"], a["action"]) for a in audit] == [(1, "freeze_admissions")]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}])
def test_without_the_token_401_and_nothing_changes(client, svc, headers):
    r = client.post("/alertmanager", json=payload(alert("GPUMemoryUtilizationHigh", **GPU)), headers=headers)
    assert r.status_code == 401
    assert svc.state()["levels"] == {} and svc.store.snapshot() is None


AUTH_HEADERS = {
    "the scheme in lower case is accepted": (f"bearer {TOKEN}", 200),
    "the scheme in upper case is accepted": (f"BEARER {TOKEN}", 200),
    "the canonical scheme is accepted": (f"Bearer {TOKEN}", 200),
    "the token is still compared case-sensitively": (f"Bearer {TOKEN.upper()}", 401),
    "another scheme with the right token is refused": (f"Basic {TOKEN}", 401),
    "the scheme alone is refused": ("Bearer", 401),
    "a token that only starts with the right one is refused": (f"Bearer {TOKEN}x", 401),
}


@pytest.mark.parametrize("value,code", AUTH_HEADERS.values(), ids=AUTH_HEADERS.keys())
def test_authorization_scheme_is_case_insensitive_rfc_7235(client, value, code):
    r = client.post("/alertmanager", json=payload(), headers={"Authorization": value})
    assert r.status_code == code


def test_oversized_body_413(client, svc):
    big = payload(*[alert("GPUMemoryUtilizationHigh", cluster="a", hw_id=f"GPU-{i}") for i in range(400)])
    r = client.post("/alertmanager", json=big, headers=AUTH)
    assert r.status_code == 413
    assert svc.state()["levels"] == {}


@pytest.mark.parametrize("body", [b"{", b'{"alerts": "x"}', (FIXTURES / "prom2teams_without_mandatory_field.json").read_bytes()])
def test_malformed_400(client, svc, body):
    r = client.post("/alertmanager", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400
    assert svc.store.snapshot() is None


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.json") if "mandatory" not in p.name))
def test_corpus_payloads_are_accepted_and_trip_nothing(client, name):
    r = client.post("/alertmanager", content=(FIXTURES / name).read_bytes(),
                    headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["decisions"] == []


def test_store_failure_is_503_and_changes_nothing(client, svc):
    svc.store._db.close()  # the disk is gone: a retry (after repair) can help
    svc.store._db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)  # no tables
    r = client.post("/alertmanager", json=payload(alert("GPUMemoryUtilizationHigh", **GPU)), headers=AUTH)
    assert r.status_code == 503
    assert svc.breaker.levels() == {}


def test_override_trips_and_is_audited(client, svc):
    body = {"scope": {"cluster": "a", "engine": "e0"}, "level": 2, "mode": "trip",
            "reason": "vision encoder rollout", "expires_in_s": 600}
    r = client.post("/override", json=body, headers=PERSON)
    assert r.status_code == 200
    assert client.get("/state", headers=AUTH).json()["levels"] == {'{cluster="a",engine="e0"}': 2}
    kinds = [a["kind"] for a in svc.store.audit_log()]
    assert kinds == ["trip", "override"]


@pytest.mark.parametrize("body", [
    {"scope": {}, "level": 9, "mode": "trip", "reason": "x", "expires_in_s": 60},
    {"scope": {}, "level": 1, "mode": "trip", "reason": "", "expires_in_s": 60},
    {"scope": {}, "level": 1, "mode": "trip", "reason": "x", "expires_in_s": 0},
    {"scope": {}, "level": 1, "mode": "later", "reason": "x", "expires_in_s": 60},
    {"level": 1},
])
def test_bad_override_400_and_nothing_changes(client, svc, body):
    assert client.post("/override", json=body, headers=PERSON).status_code == 400
    assert svc.store.audit_log() == [] and svc.state()["levels"] == {}


def test_override_needs_the_token(client, svc):
    body = {"scope": {}, "level": 1, "mode": "trip", "reason": "x", "expires_in_s": 60}
    assert client.post("/override", json=body).status_code == 401
    assert svc.store.audit_log() == []


def test_metrics_expose_level_transitions_and_notifications(client):
    client.post("/alertmanager", json=payload(alert("KVCacheGrowthRateHigh", cluster="a", engine="e0")), headers=AUTH)
    text = client.get("/metrics").text
    assert 'fusebox_fuse_level{cluster="a",engine="e0",host_name="",hw_id="",instance=""} 3.0' in text
    assert 'fusebox_fuse_transitions_total{action="kv_cache_eviction",source="alert",state="trip"} 1.0' in text
    assert 'fusebox_fuse_notifications_total{outcome="applied"} 1.0' in text


def test_openapi_lists_the_routes(client):
    paths = client.get("/openapi.json", headers=AUTH).json()["paths"]
    assert {"/alertmanager", "/override", "/state", "/metrics"} <= set(paths)


def test_openapi_describes_the_models_that_parse_the_bodies_and_the_bearer_scheme(client):
    doc = client.get("/openapi.json", headers=AUTH).json()
    schemas = doc["components"]["schemas"]
    assert {"WebhookPayload", "Alert", "OverrideRequest"} <= set(schemas)
    body = doc["paths"]["/alertmanager"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/WebhookPayload"}
    assert schemas["WebhookPayload"]["properties"]["alerts"]["items"] == {"$ref": "#/components/schemas/Alert"}
    # an alert's labels are not capped by the schema: one over 256 characters is refused alone
    assert "256" in schemas["Alert"]["properties"]["labels"]["description"]
    assert schemas["OverrideRequest"]["properties"]["scope"]["additionalProperties"]["maxLength"] == 256
    assert doc["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http", "scheme": "bearer", "description": "Authorization: Bearer <token> (scheme in any case)"}
    assert doc["paths"]["/override"]["post"]["security"] == [{"HTTPBearer": []}]


@pytest.mark.parametrize("path", ["/alertmanager", "/override"])
def test_a_wrong_token_is_401_even_when_the_body_is_not_json(client, svc, path):
    r = client.post(path, content=b"{not json", headers={"Authorization": "Bearer wrong",
                                                          "Content-Type": "application/json"})
    assert r.status_code == 401
    assert svc.store.audit_log() == []


def test_a_streamed_body_over_the_limit_is_413_without_a_content_length(client, svc):
    def chunks():
        for _ in range(80):
            yield b" " * 1024  # 80 KiB of whitespace, over the test app's 64 KiB

    r = client.post("/alertmanager", content=chunks(), headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 413 and "65536" in r.json()["error"]
    assert 'fusebox_fuse_notifications_total{outcome="http_413"} 1.0' in client.get("/metrics").text


def test_fuzz_the_api_from_its_openapi_schema(svc):
    """schemathesis: no 500 on any generated request; a rejected request changes no state."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    app = create_app(svc, TOKENS, max_body=64 * 1024)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=AUTH)
    failures, codes = [], set()
    for op_result in schema.get_all_operations():
        op = op_result.ok()

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=op.as_strategy())
        def check(case):
            before = (svc.store.snapshot(), len(svc.store.audit_log(1000)))
            base = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
            for headers in (dict(PERSON if case.path == "/override" else AUTH), {}):
                case.headers = {**base, **headers}
                r = case.call()
                codes.add((case.method, r.status_code))
                if r.status_code >= 500:
                    failures.append((case.method, case.path, r.status_code, r.text[:200]))
                if r.status_code >= 400 and case.method == "POST":
                    assert (svc.store.snapshot(), len(svc.store.audit_log(1000))) == before
                before = (svc.store.snapshot(), len(svc.store.audit_log(1000)))

        check()
    assert failures == []
    # the run reached the handlers: accepted, rejected-as-malformed and unauthenticated requests
    assert {("POST", 200), ("POST", 400), ("POST", 401), ("GET", 200)} <= codes, codes


# 200 KB, under the 1 MiB limit: nesting deeper than Python's recursion limit (1000).
DEEP = {
    "a deeply nested alerts list to the webhook": ("/alertmanager", '{"alerts":' + "[" * 100_000 + "]" * 100_000 + "}"),
    "a deeply nested scope to the override": ("/override", '{"scope":' + "[" * 100_000 + "]" * 100_000 + "}"),
    "a deeply nested object to the webhook": ("/alertmanager", '{"a":' * 100_000 + "1" + "}" * 100_000),
}


@pytest.mark.parametrize("path,body", DEEP.values(), ids=DEEP.keys())
def test_deeply_nested_json_is_400_counted_and_changes_nothing(svc, path, body):
    client = TestClient(create_app(svc, TOKENS))  # default body limit, 1 MiB
    r = client.post(path, content=body, headers={**(PERSON if path == "/override" else AUTH),
                                                 "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert svc.store.snapshot() is None and svc.store.audit_log() == []
    if path == "/alertmanager":
        assert 'fusebox_fuse_notifications_total{outcome="http_400"} 1.0' in client.get("/metrics").text


def _override(**changes):
    body = {"scope": {"cluster": "a", "engine": "e0"}, "level": 2, "mode": "trip", "reason": "canary",
            "expires_in_s": 600}
    body.update(changes)
    return {k: v for k, v in body.items() if v is not ...}


# (body, the field the answer must name, words the error must contain); worked out from docs/fuse.md.
BAD_OVERRIDES = {
    "a level given as true is refused, not read as 1": (_override(level=True), "level", "integer"),
    "a level given as a string is refused": (_override(level="2"), "level", "integer"),
    "an expiry given as a string is refused": (_override(expires_in_s="600"), "expires_in_s", "number"),
    "an expiry of zero is refused": (_override(expires_in_s=0), "expires_in_s", "greater than 0"),
    "an expiry over seven days is refused": (_override(expires_in_s=604_801), "expires_in_s", "604800"),
    "a missing expiry is refused": (_override(expires_in_s=...), "expires_in_s", "required"),
    "a missing reason is refused": (_override(reason=...), "reason", "required"),
    "an empty reason is refused": (_override(reason=""), "reason", "at least 1"),
    "an unknown mode is refused": (_override(mode="later"), "mode", "'trip' or 'release'"),
    "a level the spec does not have is refused with the levels it has": (_override(level=9), "level", "[1, 2, 3]"),
    "a scope value that is not a string is refused": (_override(scope={"cluster": 1}), "scope.cluster", "string"),
    "a body that is not JSON is refused": (b"{", "body", "not JSON"),
    "a body that is a list is refused": ([1], "body", "object"),
    "a scope label the service does not know is refused, naming it and the known ones": (
        _override(scope={"gpu": "GPU-9999"}),
        "scope.gpu", "unknown scope label 'gpu'; scope labels are cluster, host_name, instance, hw_id, engine"),
    "an unknown scope label beside known ones is refused": (
        _override(scope={"cluster": "a", "engine": "e0", "ignored": "x"}), "scope.ignored", "'ignored'"),
    "an empty scope is refused unless fleet is true": (_override(scope={}), "scope", "fleet"),
    "a scope label with an empty value is refused": (_override(scope={"cluster": "a", "hw_id": ""}), "scope.hw_id", "empty"),
    "fleet with a non-empty scope is refused": (_override(fleet=True), "fleet", "scope {}"),
    "fleet given as a string is refused": (_override(scope={}, fleet="true"), "fleet", "boolean"),
}


@pytest.mark.parametrize("body,field,words", BAD_OVERRIDES.values(), ids=BAD_OVERRIDES.keys())
def test_bad_override_answers_a_short_error_naming_the_field(client, svc, body, field, words):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = client.post("/override", content=content, headers={**PERSON, "Content-Type": "application/json"})
    assert r.status_code == 400
    got = r.json()
    assert got["field"] == field and words in got["error"], got
    assert "pydantic" not in got["error"] and "http" not in got["error"] and len(got["error"]) < 200, got
    assert svc.store.audit_log() == [] and svc.state()["scopes"] == []


def test_an_expiry_given_as_an_integer_or_a_fraction_is_accepted(client):
    assert client.post("/override", json=_override(expires_in_s=600), headers=PERSON).status_code == 200
    assert client.post("/override", json=_override(expires_in_s=0.5, level=1), headers=PERSON).status_code == 200


def test_an_empty_scope_with_fleet_true_trips_the_whole_fleet(client, svc):
    r = client.post("/override", json=_override(scope={}, fleet=True, level=1), headers=PERSON)
    assert r.status_code == 200, r.text
    assert [(d["state"], d["scope"]) for d in r.json()["decisions"]] == [("trip", {})]
    assert svc.state()["levels"] == {"{}": 1}


def _metrics_but_age(client) -> str:
    """/metrics without the oldest-pending-age sample, which grows with the clock by design."""
    age = C.FUSE_METRICS["oldest_pending_age"] + " "
    return "\n".join(line for line in client.get("/metrics").text.splitlines() if not line.startswith(age))


def test_a_release_with_part_of_the_tripped_scope_is_409_lists_the_scope_and_creates_nothing(client, svc):
    scope = {"cluster": "a", "host_name": "h1", "engine": "vllm-0"}
    key = '{cluster="a",host_name="h1",engine="vllm-0"}'
    assert client.post("/alertmanager", json=payload(alert("KVCacheGrowthRateHigh", **scope)), headers=AUTH).status_code == 200
    before = (svc.store.snapshot(), svc.store.audit_log(), _metrics_but_age(client))

    r = client.post("/override", json=_override(scope={"engine": "vllm-0"}, level=3, mode="release"), headers=PERSON)
    assert r.status_code == 409, r.text
    got = r.json()
    assert got["field"] == "scope" and got["scopes"] == [{"key": key, "labels": scope, "level": 3}]
    assert key in got["error"]
    assert (svc.store.snapshot(), svc.store.audit_log(), _metrics_but_age(client)) == before
    assert svc.state()["levels"] == {key: 3}

    r = client.post("/override", json=_override(scope=scope, level=3, mode="release"), headers=PERSON)
    assert r.status_code == 200
    assert [(d["state"], d["level"]) for d in r.json()["decisions"]] == [("release", 3)]
    assert svc.state()["levels"] == {}


def _with_fastapi_webhook_route(app):
    """``app`` with POST /alertmanager served as FastAPI serves any route (its endpoint's dependencies
    and body model solved per request): the reference the hot route must answer like."""
    from fastapi.routing import APIRoute

    from fusebox.fuse.http import routes as http_routes

    # first in the list: Starlette answers with the first route that matches
    app.router.routes.insert(0, APIRoute("/alertmanager", http_routes.alertmanager, methods=["POST"],
                                         responses=http_routes.RESPONSES))
    return app


def test_the_webhook_route_answers_every_request_as_fastapis_own_route_would(tmp_path):
    """Status, JSON body and challenge headers of POST /alertmanager for bodies that are fine, not
    JSON, not UTF-8, nested too deeply, of the wrong shape or types, empty; content types FastAPI reads
    as JSON or not; a right, wrong or missing token: the same from the hot route as from FastAPI's."""
    import itertools

    good = payload(alert("GPUMemoryUtilizationHigh", starts=1_700_000_000.0, **GPU))

    def changed(alert_fields=None, **fields):
        body = json.loads(json.dumps(good))
        body.update(fields)
        body["alerts"][0].update(alert_fields or {})
        return json.dumps(body).encode()

    bodies = [b"", b"{", b"[1]", b'"x"', b"null", b"{}", b"[" * 5000 + b"]" * 5000, b"\xff\xfe", b"version=4",
              b'{"alerts": [], "x": NaN}', b'{"alerts": [], "truncatedAlerts": "3"}', b'{"alerts": {}}',
              b'{"alerts": [], "receiver": "\\udfff"}', b'{"alerts": [], "groupKey": 123456789012345678901234567890}',
              json.dumps(good).encode(), changed(status="resolved"), changed(truncatedAlerts=-1),
              changed({"labels": {"alertname": "X", "a": 1}}), changed({"startsAt": None}), changed({"endsAt": "bad"}),
              changed({"fingerprint": "f" * 65}), changed({"annotations": {"a": 1}}), changed({"status": "pending"}),
              changed({"labels": {"alertname": "GPUMemoryUtilizationHigh", "cluster": "a", "hw_id": "x" * 300}})]
    types = [None, "application/json", "application/json; charset=utf-8", "application/problem+json", "text/plain"]
    auths = [AUTH, {"Authorization": "Bearer wrong"}, {}]
    answers = {}
    for reference in (False, True):
        svc = dry_run_service(tmp_path / str(reference))
        app = create_app(svc, TOKENS, max_body=64 * 1024)
        client = TestClient(_with_fastapi_webhook_route(app) if reference else app, raise_server_exceptions=False)
        got = []
        for body, ctype, auth in itertools.product(bodies, types, auths):
            app.state.limiter._failures.clear()  # no 429: every wrong token is a 401
            r = client.post("/alertmanager", content=body, headers={**auth, **({"Content-Type": ctype} if ctype else {})})
            doc = r.json()
            for d in doc.get("decisions", []):
                d.pop("decision_id")
            got.append((r.status_code, doc, r.headers.get_list("www-authenticate")))
        answers[reference] = got
        svc.store.close()
    assert {code for code, _, _ in answers[True]} == {200, 400, 401}
    assert [(i, a, b) for i, (a, b) in enumerate(zip(answers[False], answers[True], strict=True)) if a != b] == []
