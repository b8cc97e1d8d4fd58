"""Token files of the fuse service under change and attack (issue 22): a token removed from the
people or read file is revoked on reload (fail closed); tokens are at least 32 characters; a file
rewritten in two steps never makes a partial token live; failed authentications are counted and a
client that fails too often is answered 429 with Retry-After."""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys

import httpx
import pytest
from _fuse_support import PEOPLE, SPEC, TOKEN, free_port, payload, wait_for
from _support import finish
from fastapi.testclient import TestClient

from fusebox.fuse.http.app import create_app
from fusebox.fuse.tokens import MIN_TOKEN_LENGTH, TokenFiles

OVERRIDE = {"scope": {"cluster": "a", "engine": "e0"}, "level": 1, "mode": "trip", "reason": "canary",
            "expires_in_s": 600}


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _files(tmp_path, people: dict, read: str | None = None):
    hook, ppl, rd = tmp_path / "hook", tmp_path / "people", tmp_path / "read"
    hook.write_text(TOKEN + "\n")
    ppl.write_text("".join(f"{n} {t}\n" for n, t in people.items()))
    if read is not None:
        rd.write_text(read + "\n")
    return hook, ppl, (rd if read is not None else None)


def test_a_token_removed_from_the_people_file_is_revoked_and_an_empty_file_revokes_all(tmp_path, svc):
    hook, people, _ = _files(tmp_path, PEOPLE)
    c = TestClient(create_app(svc, TokenFiles(hook, people)))
    assert c.post("/override", json=OVERRIDE, headers=bearer(PEOPLE["bob"])).status_code == 200
    people.write_text(f"alice {PEOPLE['alice']}\n")  # bob's line removed
    assert c.post("/override", json=OVERRIDE, headers=bearer(PEOPLE["bob"])).status_code == 401
    assert c.get("/state", headers=bearer(PEOPLE["bob"])).status_code == 401
    assert c.post("/override", json=OVERRIDE, headers=bearer(PEOPLE["alice"])).status_code == 200
    people.write_text("# nobody may override now\n")
    assert c.post("/override", json=OVERRIDE, headers=bearer(PEOPLE["alice"])).status_code == 401
    people.unlink()
    assert c.post("/override", json=OVERRIDE, headers=bearer(PEOPLE["alice"])).status_code == 401
    assert c.get("/state", headers=bearer(TOKEN)).status_code == 200  # the webhook token still reads


def test_emptying_the_read_token_file_revokes_the_read_token_and_the_webhook_token_does_not_take_over(tmp_path, svc):
    read = "read-token-" + secrets.token_hex(16)
    hook, people, rd = _files(tmp_path, PEOPLE, read)
    c = TestClient(create_app(svc, TokenFiles(hook, people, rd)))
    assert c.get("/state", headers=bearer(read)).status_code == 200
    assert c.get("/state", headers=bearer(TOKEN)).status_code == 401
    rd.write_text("")
    assert c.get("/state", headers=bearer(read)).status_code == 401
    assert c.get("/state", headers=bearer(TOKEN)).status_code == 401
    assert c.get("/state", headers=bearer(PEOPLE["alice"])).status_code == 200


def test_a_file_rewritten_in_two_steps_never_makes_a_partial_token_live(tmp_path, svc):
    hook, people, _ = _files(tmp_path, {"alice": PEOPLE["alice"]})
    c = TestClient(create_app(svc, TokenFiles(hook, people)))
    new = secrets.token_urlsafe(32)  # 43 characters, as the docs make them
    with open(people, "w") as f:  # step one: the name and half the token, on disk
        f.write(f"alice {new[:21]}")
        f.flush()
        assert c.get("/state", headers=bearer(new[:21])).status_code == 401
        # the file is malformed between the steps: refused whole (fail closed), the old token too
        assert c.get("/state", headers=bearer(PEOPLE["alice"])).status_code == 401
        assert c.get("/state", headers=bearer(TOKEN)).status_code == 200  # the webhook file is its own
        f.write(new[21:] + "\n")  # step two
    assert c.get("/state", headers=bearer(new)).status_code == 200
    assert c.get("/state", headers=bearer(PEOPLE["alice"])).status_code == 401


@pytest.mark.parametrize("which", ["webhook", "people"])
def test_a_token_under_32_characters_is_refused_at_start_naming_the_file(tmp_path, which):
    hook, people, _ = _files(tmp_path, PEOPLE)
    short = "x" * (MIN_TOKEN_LENGTH - 1)
    (hook if which == "webhook" else people).write_text(short + "\n" if which == "webhook" else f"carol {short}\n")
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC), "--listen",
                        f"127.0.0.1:{free_port()}", "--state", str(tmp_path / "s.sqlite"), "--webhook-token-file",
                        str(hook), "--override-tokens", str(people), "--dry-run"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    path = hook if which == "webhook" else people
    assert f"{path}: " in r.stderr and "31 characters, at least 32" in r.stderr, r.stderr
    assert "/dev/urandom" in r.stderr  # how to make one


GATEWAY_COMMANDS = {
    "fuse serve --gateway-token-file": ["serve", "--spec", str(SPEC), "--webhook-token-file", "HOOK",
                                        "--gateway-url", "http://127.0.0.1:9", "--gateway-token-file", "GW"],
    "fuse gateway --token-file": ["gateway", "--log", "LOG", "--token-file", "GW"],
}


def _gateway_command(tmp_path, which: str, gateway_token: str, env_token: str | None = None):
    """``fusebox fuse <which>`` with ``gateway_token`` in its gateway token file (and env
    FUSEBOX_GATEWAY_TOKEN set to ``env_token``): (argv, env)."""
    import os

    hook, _, _ = _files(tmp_path, PEOPLE)
    (tmp_path / "gw").write_text(gateway_token + "\n")
    files = {"HOOK": str(hook), "GW": str(tmp_path / "gw"), "LOG": str(tmp_path / "gw.jsonl")}
    argv = [sys.executable, "-m", "fusebox.cli", "fuse", *[files.get(a, a) for a in GATEWAY_COMMANDS[which]],
            "--listen", f"127.0.0.1:{free_port()}"]
    if which.startswith("fuse serve"):
        argv += ["--state", str(tmp_path / "s.sqlite")]
    env = {k: v for k, v in os.environ.items() if k != "FUSEBOX_GATEWAY_TOKEN"}
    if env_token is not None:
        env["FUSEBOX_GATEWAY_TOKEN"] = env_token
    return argv, env


@pytest.mark.parametrize("from_env", [False, True], ids=["file", "env FUSEBOX_GATEWAY_TOKEN"])
@pytest.mark.parametrize("which", GATEWAY_COMMANDS)
def test_a_gateway_token_under_32_characters_is_refused_at_start_as_the_fuses_own(tmp_path, which, from_env):
    short = "gw-11-chars"  # the 11-character token a user had working
    good = secrets.token_urlsafe(32)
    argv, env = _gateway_command(tmp_path, which, good if from_env else short, short if from_env else None)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2, r.stderr
    where = "env FUSEBOX_GATEWAY_TOKEN" if from_env else str(tmp_path / "gw")
    assert f"{where}: the token is 11 characters, at least 32 are required" in r.stderr, r.stderr
    assert "/dev/urandom" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "gw.jsonl").exists()


def test_the_reference_gateway_with_a_32_character_token_requires_it(tmp_path):
    token = "g" * MIN_TOKEN_LENGTH
    argv, env = _gateway_command(tmp_path, "fuse gateway --token-file", token)
    url = f"http://127.0.0.1:{argv[-1].rpartition(':')[2]}/v1/control/fuse"
    body = {"action": "freeze_admissions", "level": 1, "state": "trip", "reason": "r", "scope": {}, "decision_id": "d1"}
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_for(lambda: _answers(url), 30, 0.1, "fuse gateway")
        assert httpx.post(url, json=body, headers=bearer(token[:-1]), timeout=10).status_code == 401
        assert httpx.post(url, json=body, headers=bearer(token), timeout=10).status_code == 200
    finally:
        p.terminate()
        p.wait(timeout=30)


def _answers(url):
    try:
        httpx.get(url, timeout=1)
        return True
    except httpx.HTTPError:
        return False


def test_sighup_revokes_a_removed_token_of_the_served_process(tmp_path):
    hook, people, _ = _files(tmp_path, PEOPLE)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    p = subprocess.Popen(
        [sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC), "--listen", f"127.0.0.1:{port}",
         "--state", str(tmp_path / "s.sqlite"), "--webhook-token-file", str(hook), "--override-tokens", str(people),
         "--dry-run", "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def state(token):
        return httpx.get(url + "/state", headers=bearer(token), timeout=10).status_code

    try:
        wait_for(lambda: _up(url), 30, 0.1, "fuse serve")
        assert state(PEOPLE["bob"]) == 200
        people.write_text("")
        p.send_signal(signal.SIGHUP)
        wait_for(lambda: state(PEOPLE["bob"]) == 401, 10, 0.1, "bob's token revoked")
        assert state(PEOPLE["alice"]) == 401 and state(TOKEN) == 200
        assert p.poll() is None
    finally:
        p.terminate()
        _, _, err = finish(p)
    assert "every override token is revoked" in err, err


def _up(url):
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _sample(svc, name, **labels):
    return svc.metrics.registry.get_sample_value(name, labels) or 0.0


def test_failed_authentications_are_counted_and_a_client_over_the_limit_gets_429_with_retry_after(svc):
    app = create_app(svc, _tokens(), auth_failures=5, auth_window_s=60)
    attacker = TestClient(app, client=("192.0.2.7", 40000))
    other = TestClient(app, client=("192.0.2.8", 40000))
    assert _sample(svc, "fusebox_fuse_auth_failures_total", role="webhook") == 0  # the series exists at 0
    codes = [attacker.post("/alertmanager", json={"alerts": []}, headers=bearer(f"guess-{i}")).status_code
             for i in range(5)]
    assert codes == [401] * 5
    r = attacker.post("/alertmanager", json={"alerts": []}, headers=bearer("guess-5"))
    assert r.status_code == 429, r.text
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    # while limited, a wrong token is refused 429 on every route; the right one never is (issue 34:
    # a neighbour on Alertmanager's address must not lock Alertmanager out)
    assert attacker.get("/state", headers=bearer("wrong")).status_code == 429
    assert attacker.get("/state", headers=bearer(TOKEN)).status_code == 200
    assert attacker.post("/alertmanager", json=payload(), headers=bearer(TOKEN)).status_code == 200
    assert _sample(svc, "fusebox_fuse_auth_failures_total", role="webhook") == 5
    assert _sample(svc, "fusebox_fuse_auth_rate_limited_total", role="webhook") == 1
    assert _sample(svc, "fusebox_fuse_auth_rate_limited_total", role="read") == 1
    assert _sample(svc, "fusebox_fuse_notifications_total", outcome="http_429") == 1
    # another client is not affected
    assert other.post("/alertmanager", json={"alerts": []}, headers=bearer(TOKEN)).status_code == 200
    assert other.get("/state", headers=bearer("wrong")).status_code == 401
    assert _sample(svc, "fusebox_fuse_auth_failures_total", role="read") == 1


def _tokens():
    from fusebox.fuse.tokens import Tokens

    return Tokens(webhook=TOKEN, people=dict(PEOPLE))


def test_a_deleted_people_file_is_refused_and_an_emptied_one_is_not(tmp_path):
    """Both revoke every override token; only the deleted one is an anomaly to page on
    (``fusebox_fuse_token_file_valid{file="people"}`` 0 -> FuseboxFuseTokenFileRefused): a trial
    deleted the file and the gauge stayed 1, so nobody learnt that no one could override."""
    hook, people, _ = _files(tmp_path, PEOPLE)
    files = TokenFiles(hook, people)
    assert files.valid == {"webhook": True, "people": True}
    people.write_text("# nobody may override now\n")
    assert files.reload() is True and files.valid["people"] is True and files.current().people == {}
    people.unlink()
    assert files.reload() is False and files.valid == {"webhook": True, "people": False}
    assert files.current().people == {}
    people.write_text(f"alice {PEOPLE['alice']}\n")
    assert files.reload() is True and files.valid["people"] is True and set(files.current().people) == {"alice"}
