"""``fuse.human_receiver`` as a receiver of the Prometheus Operator's ``AlertmanagerConfig`` (pure).

The spec writes the people's receiver in Alertmanager's own format (``pagerduty_configs:
[{routing_key: ...}]``), which the standalone config and the merge fragment copy as it is. An
``AlertmanagerConfig`` (monitoring.coreos.com/v1alpha1, Prometheus Operator v0.85.0) has its own
field names (``pagerdutyConfigs: [{routingKey: ...}]``) and takes every secret from a Kubernetes
Secret of its namespace (a ``{name, key}`` reference), never inline. :func:`crd_receiver` converts
the receiver types the operator path is meant for: ``webhook_configs``, ``pagerduty_configs``,
``slack_configs``, ``email_configs``, ``opsgenie_configs`` and ``msteams_configs``.

Each secret field (``routing_key`` or ``routing_key_file``, ``api_url``/``api_url_file``,
``auth_password``, a webhook's ``url_file``, ``http_config.authorization.credentials``...) becomes
a reference to the Secret ``fusebox-human-receiver`` (``conventions.K8S["human_secret"]``), key
``<type>-<index>-<field>`` (``pagerduty-0-routing-key``): the user creates that Secret, the value
is never written into ``k8s/``. A webhook's plain ``url`` stays inline, as the standalone config
has it.

What cannot be expressed (another receiver type, a field the table below does not know) is never
dropped without a word: the config holding it is left out of the ``AlertmanagerConfig`` and an
:class:`Issue` names its place in the spec; ``fusebox generate`` prints each at its spec line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fusebox import conventions as C

__all__ = ["Issue", "SUPPORTED", "crd_receiver", "secret_keys"]

# How one field of a native config maps: ("plain", crdName), ("secret", crdName) (its value, or the
# file named by its `_file` twin, comes from the Secret) or ("pairs", crdName) (a map written as
# the CRD's [{key, value}] list).
_Field = tuple[str, str]


def _plain(*names: str, **renamed: str) -> dict[str, _Field]:
    out = {n: ("plain", _camel(n)) for n in names}
    out.update({n: ("plain", crd) for n, crd in renamed.items()})
    return out


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


_COMMON = _plain("send_resolved")
# native config type -> (CRD list name, its fields); from the CRD's schema (receivers[].*Configs)
SUPPORTED: dict[str, tuple[str, dict[str, _Field]]] = {
    "webhook_configs": ("webhookConfigs", {
        **_COMMON, **_plain("url", "max_alerts", "timeout"), "url_file": ("secret", "urlSecret")}),
    "pagerduty_configs": ("pagerdutyConfigs", {
        **_COMMON, **_plain("url", "client", "description", "severity", "class", "component", "group", "source",
                            client_url="clientURL"),
        "routing_key": ("secret", "routingKey"), "service_key": ("secret", "serviceKey"),
        "details": ("pairs", "details")}),
    "slack_configs": ("slackConfigs", {
        **_COMMON, **_plain("channel", "username", "color", "title", "pretext", "text", "footer", "fallback",
                            "icon_emoji", "link_names", "short_fields", "mrkdwn_in", title_link="titleLink",
                            callback_id="callbackId", icon_url="iconURL", image_url="imageURL", thumb_url="thumbURL"),
        "api_url": ("secret", "apiURL")}),
    "email_configs": ("emailConfigs", {
        **_COMMON, **_plain("to", "from", "smarthost", "hello", "auth_username", "auth_identity", "html", "text",
                            require_tls="requireTLS"),
        "auth_password": ("secret", "authPassword"), "auth_secret": ("secret", "authSecret"),
        "headers": ("pairs", "headers")}),
    "opsgenie_configs": ("opsgenieConfigs", {
        **_COMMON, **_plain("message", "description", "source", "tags", "note", "priority", "entity", "actions",
                            "update_alerts", api_url="apiURL"),
        "api_key": ("secret", "apiKey"), "details": ("pairs", "details")}),
    "msteams_configs": ("msteamsConfigs", {
        **_COMMON, **_plain("title", "summary", "text"), "webhook_url": ("secret", "webhookUrl")}),
}


@dataclass(frozen=True)
class Issue:
    """Something of ``fuse.human_receiver`` the AlertmanagerConfig cannot hold: ``path`` in the
    spec (``("fuse", "human_receiver", "telegram_configs")``), what, and how to fix it."""

    path: tuple
    what: str
    fix: str


def _key(kind: str, i: int, field: str) -> str:
    """The Secret key of one secret field: ``pagerduty-0-routing-key``."""
    return f"{kind.removesuffix('_configs')}-{i}-{field.removesuffix('_file')}".replace("_", "-")


def _ref(key: str) -> dict[str, str]:
    return {"name": C.K8S["human_secret"], "key": key}


def _http_config(value: Any, kind: str, i: int) -> tuple[dict[str, Any] | None, str | None]:
    """``http_config`` with an ``authorization`` only (its credentials from the Secret); else the
    name of what cannot be expressed."""
    if not isinstance(value, dict) or set(value) - {"authorization"}:
        extra = sorted(set(value) - {"authorization"}) if isinstance(value, dict) else []
        return None, f"http_config.{extra[0]}" if extra else "http_config"
    auth = value["authorization"]
    if not isinstance(auth, dict) or set(auth) - {"type", "credentials", "credentials_file"}:
        return None, "http_config.authorization"
    out: dict[str, Any] = {"type": str(auth.get("type", "Bearer"))}
    if "credentials" in auth or "credentials_file" in auth:
        out["credentials"] = _ref(_key(kind, i, "credentials"))
    return {"authorization": out}, None


def _convert(kind: str, i: int, cfg: Any) -> tuple[dict[str, Any] | None, str | None]:
    """One native config as the CRD writes it, or (None, the field that cannot be expressed)."""
    if not isinstance(cfg, dict):
        return None, "the entry (not a mapping)"
    fields = SUPPORTED[kind][1]
    out: dict[str, Any] = {}
    for name, value in cfg.items():
        if name == "http_config":
            http, bad = _http_config(value, kind, i)
            if bad:
                return None, bad
            out["httpConfig"] = http
            continue
        how = fields.get(name)
        twin = fields.get(name.removesuffix("_file")) if name.endswith("_file") else None
        if how is None and twin is not None and twin[0] == "secret":  # routing_key_file: the same Secret key
            how = twin
        if how is None:
            return None, name
        what, crd = how
        if what == "plain":
            out[crd] = value
        elif what == "secret":
            out[crd] = _ref(_key(kind, i, name))
        elif not isinstance(value, dict):
            return None, name
        else:
            out[crd] = [{"key": str(k), "value": str(v)} for k, v in value.items()]
    return out, None


def crd_receiver(human: dict[str, Any]) -> tuple[dict[str, Any], list[Issue]]:
    """``human`` (``fuse.human_receiver``, Alertmanager's format) as an AlertmanagerConfig receiver.

    Returns:
        (``{name, <type>Configs: [...]}`` with every secret a reference to the Secret
        ``conventions.K8S["human_secret"]``, the issues: each receiver type or config entry left out,
        with its spec path). A receiver with no configs at all is returned as ``{name}`` (it notifies
        nobody: :func:`fusebox.generator.render_alertmanager.operator_warnings` says so).
    """
    at = ("fuse", "human_receiver")
    out: dict[str, Any] = {"name": human["name"]}
    issues: list[Issue] = []
    for kind, configs in human.items():
        if kind == "name":
            continue
        if kind not in SUPPORTED:
            issues.append(Issue(at + (kind,), f"fuse.human_receiver.{kind} cannot be expressed in "
                                f"k8s/alertmanagerconfig.yml by fusebox: it is left out there, so on the Prometheus "
                                "Operator path it notifies nobody",
                                f"use one of {', '.join(SUPPORTED)} for the operator path, or route fusebox's "
                                "alerts to this receiver from your main Alertmanager config"))
            continue
        if not isinstance(configs, list):
            issues.append(Issue(at + (kind,), f"fuse.human_receiver.{kind} is not a list: left out of "
                                "k8s/alertmanagerconfig.yml", f"write {kind}: [{{...}}]"))
            continue
        converted = []
        for i, cfg in enumerate(configs):
            crd, bad = _convert(kind, i, cfg)
            if crd is None:
                parts = tuple(str(bad).split("."))
                where = at + (kind, i) + (parts if isinstance(cfg, dict) and parts[0] in cfg else ())
                issues.append(Issue(where, f"fuse.human_receiver.{kind}[{i}]: {bad} cannot be expressed in "
                                    "k8s/alertmanagerconfig.yml by fusebox: this config is left out there, so on "
                                    "the Prometheus Operator path it notifies nobody",
                                    f"remove {bad} (fields fusebox converts: "
                                    f"{', '.join(sorted(SUPPORTED[kind][1]))}, http_config.authorization), or route "
                                    "fusebox's alerts to this receiver from your main Alertmanager config"))
                continue
            converted.append(crd)
        if converted:
            out[SUPPORTED[kind][0]] = converted
    return out, issues


def secret_keys(receiver: dict[str, Any]) -> list[str]:
    """The keys of the Secret ``conventions.K8S["human_secret"]`` a converted receiver reads, in order."""
    keys: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            if v.get("name") == C.K8S["human_secret"] and set(v) == {"name", "key"}:
                keys.append(v["key"])
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(receiver)
    return keys
