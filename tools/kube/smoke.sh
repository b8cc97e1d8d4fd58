#!/usr/bin/env bash
# Smoke test of the tools tools/build-kube.sh, tools/build-operator-crds.sh and
# tools/build-prometheus-operator.sh put into TOOLS_DIR: starts etcd, kube-apiserver and the
# Prometheus Operator on loopback (free ports, a throwaway folder), waits for /readyz, lists the
# namespaces, installs the operator's ten CRDs, creates a PrometheusRule and checks that the
# operator's controllers start. Everything it starts is stopped on exit. README.md beside this
# file explains each flag.
#
# Usage: tools/kube/smoke.sh TOOLS_DIR      (needs openssl, curl and python3;
#                                           SMOKE_KEEP=1 keeps the folder with the logs)
set -euo pipefail
TOOLS=${1:?usage: smoke.sh TOOLS_DIR}
K8S=$TOOLS/kubernetes-v1.37.2
OPERATOR=$TOOLS/prometheus-operator-v0.85.0/operator
CRDS=$TOOLS/prometheus-operator-crds-v0.85.0
work=$(mktemp -d)
pids=()
stop() {  # stop PID: SIGTERM, then SIGKILL after 20 s
  local i
  kill "$1" 2>/dev/null || return 0
  for i in $(seq 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.2; done
  kill -9 "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  # last started first: kube-apiserver does not finish shutting down while etcd is gone
  local i start
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    start=$SECONDS; stop "${pids[i]}"
    echo "smoke: stopped pid ${pids[i]} in $((SECONDS - start)) s"
  done
  if [ -n "${SMOKE_KEEP:-}" ]; then echo "smoke: logs and files kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
fail() { echo "smoke: $*" >&2; for f in "$work"/*.log; do echo "--- $f" >&2; tail -n 30 "$f" >&2; done; exit 1; }
ETCD_CLIENT=$(free_port); ETCD_PEER=$(free_port); APISERVER=$(free_port); OPERATOR_WEB=$(free_port)

# 1. etcd: one member, plain HTTP on loopback
"$K8S/etcd" --name smoke --data-dir "$work/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT" --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
  --initial-cluster "smoke=http://127.0.0.1:$ETCD_PEER" \
  --unsafe-no-fsync --log-level warn >"$work/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  curl -fsS "http://127.0.0.1:$ETCD_CLIENT/health" 2>/dev/null | grep -q '"health":"true"' && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$ETCD_CLIENT/health" | grep -q '"health":"true"' || fail "etcd is not healthy"
echo "smoke: $("$K8S/etcd" --version | head -1) healthy on 127.0.0.1:$ETCD_CLIENT"

# 2. kube-apiserver: a self-signed serving certificate for 127.0.0.1, a static token, a
#    service-account signing key
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=127.0.0.1" \
  -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" -addext "basicConstraints=critical,CA:TRUE" \
  -keyout "$work/serving.key" -out "$work/serving.crt" 2>/dev/null
openssl genrsa -out "$work/sa.key" 2048 2>/dev/null
openssl rsa -in "$work/sa.key" -pubout -out "$work/sa.pub" 2>/dev/null
TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
echo "$TOKEN,smoke-admin,smoke-admin,system:masters" >"$work/tokens.csv"
"$K8S/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$ETCD_CLIENT" \
  --bind-address 127.0.0.1 --secure-port "$APISERVER" --advertise-address 127.0.0.1 \
  --tls-cert-file "$work/serving.crt" --tls-private-key-file "$work/serving.key" --cert-dir "$work/certs" \
  --token-auth-file "$work/tokens.csv" --authorization-mode AlwaysAllow --anonymous-auth=false \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$work/sa.pub" --service-account-signing-key-file "$work/sa.key" \
  --service-cluster-ip-range 10.96.0.0/24 --endpoint-reconciler-type none \
  >"$work/kube-apiserver.log" 2>&1 &
pids+=($!)
api() { curl -sS --cacert "$work/serving.crt" -H "Authorization: Bearer $TOKEN" "$@"; }
start=$SECONDS
until [ "$(api -o /dev/null -w '%{http_code}' "https://127.0.0.1:$APISERVER/readyz" 2>/dev/null)" = 200 ]; do
  [ $((SECONDS - start)) -lt 120 ] || fail "kube-apiserver not ready after 120 s"
  kill -0 "${pids[-1]}" 2>/dev/null || fail "kube-apiserver exited"
  sleep 0.5
done
echo "smoke: kube-apiserver $(api "https://127.0.0.1:$APISERVER/version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["gitVersion"])') ready on 127.0.0.1:$APISERVER after $((SECONDS - start)) s"
echo "smoke: namespaces: $(api "https://127.0.0.1:$APISERVER/api/v1/namespaces" | python3 -c 'import json,sys; print(" ".join(i["metadata"]["name"] for i in json.load(sys.stdin)["items"]))')"

# 3. the operator's CRDs, by server-side apply (the kubectl apply --server-side request)
codes=()
applied=$SECONDS
for f in "$CRDS"/*.yaml; do
  name=$(basename "$f" .yaml); name=${name#monitoring.coreos.com_}.monitoring.coreos.com
  code=$(api -o "$work/apply.out" -w '%{http_code}' -X PATCH -H 'Content-Type: application/apply-patch+yaml' \
    --data-binary "@$f" "https://127.0.0.1:$APISERVER/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$name?fieldManager=fusebox&force=true")
  case $code in 200|201) codes+=("$code") ;; *) cat "$work/apply.out" >&2; fail "applying $name: HTTP $code" ;; esac
done
echo "smoke: CRDs applied, HTTP status $(printf '%s\n' "${codes[@]}" | sort | uniq -c | awk '{printf "%s x%s ", $2, $1}')"
for f in "$CRDS"/*.yaml; do
  name=$(basename "$f" .yaml); name=${name#monitoring.coreos.com_}.monitoring.coreos.com
  start=$SECONDS
  until api "https://127.0.0.1:$APISERVER/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$name" |
      python3 -c 'import json,sys; c=json.load(sys.stdin)["status"].get("conditions",[]); sys.exit(not any(x["type"]=="Established" and x["status"]=="True" for x in c))'; do
    [ $((SECONDS - start)) -lt 30 ] || fail "CRD $name not Established"
    sleep 0.5
  done
done
echo "smoke: $(ls "$CRDS"/*.yaml | wc -l) CRDs established $((SECONDS - applied)) s after the first apply"

# 4. the operator, with a kubeconfig (it reads $KUBECONFIG; it has no --kubeconfig flag)
cat >"$work/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: smoke
  cluster: {server: "https://127.0.0.1:$APISERVER", certificate-authority: "$work/serving.crt"}
users:
- name: smoke-admin
  user: {token: "$TOKEN"}
contexts:
- name: smoke
  context: {cluster: smoke, user: smoke-admin}
current-context: smoke
EOF
KUBECONFIG="$work/kubeconfig" "$OPERATOR" --web.listen-address "127.0.0.1:$OPERATOR_WEB" \
  --log-level info --log-format logfmt >"$work/operator.log" 2>&1 &
pids+=($!)
start=$SECONDS
synced() {  # each of the four controllers logs this once its informers have synced
  local c
  for c in prometheus prometheusagent alertmanager thanos; do
    grep "component=$c-controller" "$work/operator.log" 2>/dev/null | grep -q "successfully synced all caches" || return 1
  done
}
until synced; do
  [ $((SECONDS - start)) -lt 60 ] || fail "the operator's controllers did not sync in 60 s"
  kill -0 "${pids[-1]}" 2>/dev/null || fail "the operator exited"
  sleep 0.5
done
curl -fsS "http://127.0.0.1:$OPERATOR_WEB/healthz" >/dev/null || fail "operator /healthz"
echo "smoke: operator $("$OPERATOR" --short-version) running; its controllers synced after $((SECONDS - start)) s:"
grep -E "successfully synced all caches|Kubernetes API capabilities|connection established" "$work/operator.log" | sed 's/^/  /'

# 5. a PrometheusRule round trip through the API server
api -fo /dev/null -X POST -H 'Content-Type: application/yaml' --data-binary @- \
  "https://127.0.0.1:$APISERVER/apis/monitoring.coreos.com/v1/namespaces/default/prometheusrules" <<'EOF'
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: smoke}
spec:
  groups:
  - name: smoke
    rules:
    - alert: Smoke
      expr: vector(1) > 0
EOF
api -f "https://127.0.0.1:$APISERVER/apis/monitoring.coreos.com/v1/namespaces/default/prometheusrules/smoke" >/dev/null
echo "smoke: PrometheusRule created and read back"

# 6. a Prometheus selecting every PrometheusRule and ServiceMonitor of its namespace: the operator
#    writes the rules into a ConfigMap, its configuration into a Secret and creates the
#    StatefulSet (whose pods nothing runs: there is no scheduler or kubelet)
api -fo /dev/null -X POST -H 'Content-Type: application/yaml' --data-binary @- \
  "https://127.0.0.1:$APISERVER/apis/monitoring.coreos.com/v1/namespaces/default/prometheuses" <<'EOF'
apiVersion: monitoring.coreos.com/v1
kind: Prometheus
metadata: {name: smoke}
spec:
  replicas: 1
  ruleSelector: {}
  serviceMonitorSelector: {}
EOF
start=$SECONDS
until api -f "https://127.0.0.1:$APISERVER/api/v1/namespaces/default/configmaps/prometheus-smoke-rulefiles-0" 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin)["data"]; sys.exit(not any("alert: Smoke" in v for v in d.values()))' 2>/dev/null; do
  [ $((SECONDS - start)) -lt 60 ] || fail "no rules ConfigMap for the Prometheus after 60 s"
  sleep 0.5
done
until api -f "https://127.0.0.1:$APISERVER/apis/apps/v1/namespaces/default/statefulsets/prometheus-smoke" >/dev/null 2>&1 &&
    api -f "https://127.0.0.1:$APISERVER/api/v1/namespaces/default/secrets/prometheus-smoke" >/dev/null 2>&1; do
  [ $((SECONDS - start)) -lt 60 ] || fail "no StatefulSet or config Secret for the Prometheus after 60 s"
  sleep 0.5
done
echo "smoke: the operator reconciled the Prometheus in $((SECONDS - start)) s: ConfigMap prometheus-smoke-rulefiles-0 holds the rule, StatefulSet prometheus-smoke and its config Secret prometheus-smoke exist; all good"
