#!/usr/bin/env python3
"""Checks of the Helm chart charts/noetl, offline (run by `make check-deploy`).

- lints the chart (Helm 4 SDK, helm-python-sdk) with its default values,
  with every ci/*-values.yaml and with the api variants (API_VARIANTS);
- renders it for each of them and validates every manifest against the
  Kubernetes schemas (kubernetes-validate, strict: unknown fields fail).
  ServiceMonitor and ScaledObject are CRDs without a built-in schema: they
  are skipped by kind (and said so), their key fields asserted here instead;
- asserts what the manifests must say: one Deployment per service and per
  enabled executor kind (the kinds of services/cli/src/commands/common.rs),
  the release instance label in every selector, probes, security context,
  grace periods above the kinds' task timeouts (read from the Rust sources),
  the stream and durable consumer names KEDA watches, the NATS settings;
- asserts the api component (services.api): its args, port, probes, TLS
  files, the bootstrap token from a Secret (never a literal), its Service,
  Ingress and token Secret, and that turning it on changes no other object;
- asserts that unsafe values fail to render with a message naming what to
  set (tests/unsafe-multi-replica-values.yaml and a few inline cases).

Prints one line per check group and a summary; exits 1 on any problem.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import sys
from importlib import metadata
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import yaml

CHART = Path(__file__).resolve().parents[1]
ROOT = CHART.parents[1]
RELEASE = "noetl"
NAMESPACE = "noetl"
# The floor of Chart.yaml's kubeVersion and the newest schemas shipped.
K8S_VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]
# Custom resources: no schema in kubernetes-validate.
CRD_KINDS = {"ServiceMonitor", "ScaledObject"}
SERVICES = {"router": "router", "scheduler": "scheduler", "loop-supervisor": "loopSupervisor"}
DATA_DIR = "/var/lib/noetl"
API_TLS_DIR = "/etc/noetl/api-tls"
UNSAFE = CHART / "tests" / "unsafe-multi-replica-values.yaml"


class Checks:
    """Collects failures; `ok` records an assertion."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.count = 0

    def ok(self, cond: bool, what: str) -> bool:
        self.count += 1
        if not cond:
            self.failures.append(what)
        return cond


def rust_source(rel: str) -> str:
    return (ROOT / rel).read_text()


def known_kinds() -> list[str]:
    """The built-in tool kinds: `name`s of `KINDS` in crates/core/src/tool.rs."""
    src = rust_source("crates/core/src/tool.rs")
    m = re.search(r"pub const KINDS: &\[Kind\] = &\[(.*?)\n\];", src, re.S)
    kinds = re.findall(r'name: "([^"]+)"', m.group(1)) if m else []
    if not kinds:
        sys.exit("check_chart: KINDS not found in crates/core/src/tool.rs")
    return kinds


def secs(rel: str, name: str) -> int:
    m = re.search(rf"pub const {name}: Duration = Duration::from_secs\((\d+)\)", rust_source(rel))
    if not m:
        sys.exit(f"check_chart: {name} not found in {rel}")
    return int(m.group(1))


def task_timeouts() -> dict[str, int]:
    """The longest a single task of each kind runs by default (seconds)."""
    return {
        "python": secs("services/executors/python/src/config.rs", "DEFAULT_TIMEOUT"),
        "http": secs("services/executors/http/src/request.rs", "DEFAULT_CONNECT")
        + secs("services/executors/http/src/request.rs", "DEFAULT_READ"),
        "postgres": secs("services/executors/postgres/src/config.rs", "DEFAULT_CONNECT")
        + secs("services/executors/postgres/src/config.rs", "DEFAULT_TIMEOUT"),
        "duckdb": secs("services/executors/duckdb/src/lib.rs", "DEFAULT_TIMEOUT"),
        "nats": secs("services/executors/nats/src/config.rs", "DEFAULT_CONNECT")
        + secs("services/executors/nats/src/config.rs", "DEFAULT_TIMEOUT"),
        "shell": secs("services/executors/shell/src/config.rs", "DEFAULT_TIMEOUT"),
    }


def work_stream(prefix: str) -> str:
    # crates/mesh/src/subjects.rs: Subjects::work_stream
    return prefix.upper().replace("-", "_") + "_WORK"


def executor_durable(prefix: str, kind: str) -> str:
    # services/executor/src/lib.rs ("executor-{kind}") under topology.rs's
    # "{prefix}-{durable}".
    return f"{prefix}-executor-{kind}"


def render(chart: helm.Chart, values: dict) -> list[dict]:
    out = chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith(".yaml"):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def check_lint(c: Checks, name: str, values: dict | None) -> None:
    report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE)
    bad = [m for m in report["messages"] if m["severity"] >= 2] + [
        {"error": e} for e in report["errors"]
    ]
    c.ok(not bad, f"{name}: helm lint (strict): {bad}")


def check_schemas(c: Checks, name: str, docs: list[dict]) -> list[str]:
    skipped = []
    for d in docs:
        what = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] in CRD_KINDS:
            skipped.append(what)
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(d, version, strict=True)
                c.ok(True, "")
            except kubernetes_validate.ValidationError as e:
                c.ok(False, f"{name}: {what} invalid for Kubernetes {version}: {e}")
    return skipped


def check_manifests(c: Checks, name: str, docs: list[dict], v: dict, kinds: list[str]) -> None:
    """Assert the facts every rendering must show, derived from the merged values `v`."""
    by_kind: dict[str, dict[str, dict]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
        labels = d["metadata"].get("labels", {})
        c.ok(
            labels.get("app.kubernetes.io/instance") == RELEASE,
            f"{name}: {d['kind']}/{d['metadata']['name']} lacks app.kubernetes.io/instance={RELEASE}",
        )
    deployments = by_kind.get("Deployment", {})
    enabled = [k for k, ex in v["executors"].items() if ex and ex.get("enabled", True)]
    c.ok(set(v["executors"]) <= set(kinds), f"{name}: executors {sorted(v['executors'])} not all in {kinds}")
    expected = {f"{RELEASE}-{s}": (s, None) for s in SERVICES}
    if (v["services"].get("timer") or {}).get("enabled"):
        expected[f"{RELEASE}-timer"] = ("timer", None)
    if (v["services"].get("api") or {}).get("enabled"):
        expected[f"{RELEASE}-api"] = ("api", None)
    expected.update({f"{RELEASE}-executor-{k}": ("executor", k) for k in enabled})
    c.ok(
        set(deployments) == set(expected),
        f"{name}: Deployments {sorted(deployments)} != one per service and enabled kind {sorted(expected)}",
    )
    sa = v["serviceAccount"]
    sa_name = sa["name"] or RELEASE
    if sa["create"]:
        acct = by_kind.get("ServiceAccount", {}).get(sa_name)
        c.ok(acct is not None and acct.get("automountServiceAccountToken") is False,
             f"{name}: ServiceAccount {sa_name} missing or automounts its token")
    timeouts = task_timeouts()
    pdb = v["podDisruptionBudget"]
    for dname, (component, kind) in expected.items():
        dep = deployments.get(dname)
        if dep is None:
            continue
        is_api = component == "api"
        cfg = v["executors"][kind] if kind else v["services"][SERVICES.get(component, component)]
        where = f"{name}: Deployment {dname}"
        # The api serves on its own port, named https when it serves TLS.
        port = cfg["port"] if is_api else v["httpPort"]
        tls = bool(is_api and cfg["tls"]["existingSecret"])
        port_name = "https" if tls else "http"
        sel = dep["spec"]["selector"]["matchLabels"]
        pod = dep["spec"]["template"]
        c.ok(sel.get("app.kubernetes.io/instance") == RELEASE, f"{where}: selector lacks the instance label")
        c.ok(sel.get("app.kubernetes.io/component") == component, f"{where}: selector component {sel}")
        if kind:
            c.ok(sel.get("noetl.io/kind") == kind, f"{where}: selector lacks noetl.io/kind={kind}")
        c.ok(all(pod["metadata"]["labels"].get(k) == x for k, x in sel.items()),
             f"{where}: pod labels do not match the selector")
        auto = {**v["autoscaling"], **(cfg.get("autoscaling") or {})} if kind else {}
        if auto.get("enabled"):
            c.ok("replicas" not in dep["spec"], f"{where}: autoscaled but sets replicas")
        else:
            c.ok(dep["spec"].get("replicas") == cfg["replicas"], f"{where}: replicas != {cfg['replicas']}")
        spec = pod["spec"]
        c.ok(spec.get("automountServiceAccountToken") is False, f"{where}: automounts a token")
        c.ok(spec.get("serviceAccountName") == sa_name, f"{where}: service account")
        c.ok(spec.get("terminationGracePeriodSeconds") == cfg["terminationGracePeriodSeconds"],
             f"{where}: terminationGracePeriodSeconds != values")
        if kind in timeouts:
            c.ok(spec["terminationGracePeriodSeconds"] > timeouts[kind],
                 f"{where}: grace {spec['terminationGracePeriodSeconds']} s is not above the "
                 f"{kind} task timeout {timeouts[kind]} s")
        psc = spec.get("securityContext", {})
        c.ok(psc.get("runAsNonRoot") is True and psc.get("runAsUser") == 10001
             and psc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
             f"{where}: pod securityContext {psc}")
        c.ok(all(t.get("labelSelector", {}).get("matchLabels") for t in spec.get("topologySpreadConstraints", [])),
             f"{where}: a topology spread constraint has no labelSelector")
        if v["metrics"]["podAnnotations"]:
            ann = pod["metadata"].get("annotations", {})
            c.ok(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == str(port)
                 and ann.get("prometheus.io/scheme") == ("https" if tls else None),
                 f"{where}: Prometheus annotations {ann}")
        (ctr,) = spec["containers"]
        args = ctr["args"]
        if kind:
            c.ok(args[:4] == ["serve", "executor", "--kind", kind], f"{where}: args {args}")
        elif is_api:
            c.ok(args[:4] == ["serve", "api", "--http-addr", f"0.0.0.0:{port}"], f"{where}: args {args}")
        else:
            c.ok(args[:2] == ["serve", component], f"{where}: args {args}")
        if is_api:
            c.ok("--concurrency" not in args, f"{where}: the api takes no --concurrency: {args}")
        else:
            c.ok(f"--concurrency {cfg['concurrency']}" in " ".join(args), f"{where}: --concurrency")
        c.ok(f"--http-addr 0.0.0.0:{port}" in " ".join(args), f"{where}: --http-addr")
        c.ok(ctr["ports"] == [{"name": port_name, "containerPort": port, "protocol": "TCP"}],
             f"{where}: ports {ctr['ports']}")
        for probe, path in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz")]:
            got = ctr.get(probe, {}).get("httpGet", {})
            want = {"path": path, "port": port_name, **({"scheme": "HTTPS"} if tls else {})}
            c.ok(got == want, f"{where}: {probe} {got} != {want}")
        csc = ctr.get("securityContext", {})
        c.ok(csc.get("readOnlyRootFilesystem") is True and csc.get("allowPrivilegeEscalation") is False
             and csc.get("capabilities", {}).get("drop") == ["ALL"] and csc.get("runAsNonRoot") is True,
             f"{where}: container securityContext {csc}")
        mounts = {m["mountPath"]: m["name"] for m in ctr.get("volumeMounts", [])}
        vols = {x["name"]: x for x in spec.get("volumes", [])}
        for path in (DATA_DIR, "/tmp"):
            c.ok(path in mounts and "emptyDir" in vols.get(mounts[path], {}), f"{where}: no emptyDir on {path}")
        env = env_of(ctr)
        c.ok(env.get("NOETL_HOME", {}).get("value") == DATA_DIR, f"{where}: NOETL_HOME")
        c.ok(env.get("NOETL_NATS_URL", {}).get("value") == v["nats"]["url"], f"{where}: NOETL_NATS_URL")
        c.ok(env.get("NOETL_PREFIX", {}).get("value") == v["prefix"], f"{where}: NOETL_PREFIX")
        c.ok(env.get("NOETL_REPLICAS", {}).get("value") == str(v["nats"]["replicas"]),
             f"{where}: NOETL_REPLICAS != {v['nats']['replicas']}")
        otlp = v.get("tracing", {}).get("otlpEndpoint", "")
        if otlp:
            c.ok(env.get("OTEL_EXPORTER_OTLP_ENDPOINT", {}).get("value") == otlp,
                 f"{where}: OTEL_EXPORTER_OTLP_ENDPOINT")
            c.ok(env.get("OTEL_EXPORTER_OTLP_PROTOCOL", {}).get("value") == v["tracing"].get("protocol", "http/protobuf"),
                 f"{where}: OTEL_EXPORTER_OTLP_PROTOCOL")
        else:
            c.ok("OTEL_EXPORTER_OTLP_ENDPOINT" not in env, f"{where}: spans exported without tracing.otlpEndpoint")
        for var, ref in [("NOETL_SECRET_KEY", v["secretKey"]["existingSecret"]),
                         ("AWS_SECRET_ACCESS_KEY", v["objectStore"]["existingSecret"])]:
            if ref:
                got = env.get(var, {}).get("valueFrom", {}).get("secretKeyRef", {}).get("name")
                c.ok(got == ref, f"{where}: {var} not from Secret {ref}")
            else:
                c.ok(var not in env, f"{where}: {var} set without a Secret")
        if kind == "python":
            warm = str((cfg.get("env") or {}).get("NOETL_PYTHON_WARM", cfg["concurrency"]))
            c.ok(env.get("NOETL_PYTHON_WARM", {}).get("value") == warm,
                 f"{where}: NOETL_PYTHON_WARM != {warm} (one warm interpreter per slot)")
        c.ok(all("value" not in e for n, e in env.items() if re.search("SECRET|PASSWORD|TOKEN", n)),
             f"{where}: a secret is set as a plain value")
        # The Service of the component (metrics port; the api's also carries
        # its traffic, see check_api).
        svc = by_kind.get("Service", {}).get(dname)
        c.ok(svc is not None and svc["spec"]["selector"] == sel
             and [p["name"] for p in svc["spec"]["ports"]] == [port_name],
             f"{where}: no Service with its selector and port {port_name}")
        if svc is not None and not is_api:
            c.ok(svc["spec"].get("clusterIP") == "None", f"{where}: its metrics Service is not headless")
        # Its PodDisruptionBudget.
        budget = by_kind.get("PodDisruptionBudget", {}).get(dname)
        want_pdb = {**pdb, **(cfg.get("podDisruptionBudget") or {})}.get("enabled")
        c.ok((budget is not None) == bool(want_pdb), f"{where}: PodDisruptionBudget present={budget is not None}")
        if budget:
            c.ok(budget["spec"]["selector"]["matchLabels"] == sel, f"{where}: PDB selector")
        # Its autoscaler.
        hpa = by_kind.get("HorizontalPodAutoscaler", {}).get(dname)
        so = by_kind.get("ScaledObject", {}).get(dname)
        if auto.get("enabled") and auto.get("type") == "keda":
            c.ok(hpa is None and so is not None, f"{where}: KEDA autoscaling but no ScaledObject")
            if so:
                (trig,) = so["spec"]["triggers"]
                md = trig["metadata"]
                c.ok(trig["type"] == "nats-jetstream", f"{where}: trigger type {trig['type']}")
                c.ok(md["stream"] == work_stream(v["prefix"]), f"{where}: stream {md['stream']}")
                c.ok(md["consumer"] == executor_durable(v["prefix"], kind), f"{where}: consumer {md['consumer']}")
                c.ok(so["spec"]["scaleTargetRef"]["name"] == dname, f"{where}: ScaledObject target")
                c.ok(so["spec"]["minReplicaCount"] == auto["minReplicas"]
                     and so["spec"]["maxReplicaCount"] == auto["maxReplicas"], f"{where}: ScaledObject bounds")
        elif auto.get("enabled"):
            c.ok(so is None and hpa is not None, f"{where}: HPA autoscaling but no HorizontalPodAutoscaler")
            if hpa:
                c.ok(hpa["spec"]["scaleTargetRef"]["name"] == dname, f"{where}: HPA target")
                c.ok(ctr["resources"].get("requests", {}).get("cpu"), f"{where}: HPA without a CPU request")
        else:
            c.ok(hpa is None and so is None, f"{where}: autoscaler without autoscaling.enabled")
    sm = by_kind.get("ServiceMonitor", {})
    c.ok(bool(sm) == bool(v["metrics"]["serviceMonitor"]["enabled"]), f"{name}: ServiceMonitor present={bool(sm)}")
    for m in sm.values():
        c.ok(m["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/instance") == RELEASE
             and m["spec"]["endpoints"][0]["port"] == "http", f"{name}: ServiceMonitor selector/port")
    check_api(c, name, by_kind, v)


def check_api(c: Checks, name: str, by_kind: dict[str, dict[str, dict]], v: dict) -> None:
    """The api component (services.api): Deployment, Service, Ingress, token Secret."""
    api = v["services"]["api"]
    dname = f"{RELEASE}-api"
    chart_secret = f"{RELEASE}-api-token"
    where = f"{name}: api"
    api_objects = sorted(f"{k}/{n}" for k, objs in by_kind.items() for n, d in objs.items()
                         if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "api")
    if not api["enabled"]:
        c.ok(not api_objects, f"{where}: disabled, yet rendered {api_objects}")
        return
    auth, tls_secret, svc_cfg, ing_cfg = api["auth"], api["tls"]["existingSecret"], api["service"], api["ingress"]
    insecure = bool(auth["insecureNoAuth"])
    port_name = "https" if tls_secret else "http"
    want_objects = {f"Deployment/{dname}", f"Service/{dname}"}
    if {**v["podDisruptionBudget"], **(api.get("podDisruptionBudget") or {})}.get("enabled"):
        want_objects.add(f"PodDisruptionBudget/{dname}")
    if ing_cfg["enabled"]:
        want_objects.add(f"Ingress/{dname}")
    if not insecure and not auth["existingSecret"]:
        want_objects.add(f"Secret/{chart_secret}")
    c.ok(set(api_objects) == want_objects, f"{where}: objects {api_objects} != {sorted(want_objects)}")
    dep = by_kind.get("Deployment", {}).get(dname)
    if not c.ok(dep is not None, f"{where}: no Deployment {dname}"):
        return
    spec = dep["spec"]["template"]["spec"]
    (ctr,) = spec["containers"]
    want_args = ["serve", "api", "--http-addr", f"0.0.0.0:{api['port']}", "--log-format", v["logFormat"]]
    if insecure:
        want_args.append("--insecure-no-auth")
    if tls_secret:
        want_args += ["--tls-cert", f"{API_TLS_DIR}/tls.crt", "--tls-key", f"{API_TLS_DIR}/tls.key"]
    c.ok(ctr["args"] == want_args, f"{where}: args {ctr['args']} != {want_args}")
    # The bootstrap token: from a Secret, never a literal; none without auth.
    env = env_of(ctr)
    token = env.get("NOETL_API_BOOTSTRAP_TOKEN")
    secrets = by_kind.get("Secret", {})
    if insecure:
        c.ok(token is None, f"{where}: insecureNoAuth, yet NOETL_API_BOOTSTRAP_TOKEN is set")
    else:
        ref = {"name": auth["existingSecret"] or chart_secret, "key": auth["key"]}
        c.ok(token == {"name": "NOETL_API_BOOTSTRAP_TOKEN", "valueFrom": {"secretKeyRef": ref}},
             f"{where}: NOETL_API_BOOTSTRAP_TOKEN {token} is not the secretKeyRef {ref}")
        c.ok("--insecure-no-auth" not in ctr["args"], f"{where}: --insecure-no-auth with a token")
    made = secrets.get(chart_secret)
    if made is not None:
        data = made.get("data") or {}
        c.ok(list(data) == [auth["key"]] and not made.get("stringData"), f"{where}: token Secret keys {list(data)}")
        raw = base64.b64decode(data.get(auth["key"], "")).decode()
        c.ok(re.fullmatch(r"[A-Za-z0-9]{48}", raw) is not None, f"{where}: the token is not 48 random alphanumerics")
        c.ok(made["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep",
             f"{where}: token Secret not kept (helm.sh/resource-policy: keep)")
        c.ok(made.get("type") == "Opaque", f"{where}: token Secret type {made.get('type')}")
    # TLS files mounted from the Secret, read-only.
    mounts = {m["name"]: m for m in ctr.get("volumeMounts", [])}
    vols = {x["name"]: x for x in spec.get("volumes", [])}
    if tls_secret:
        c.ok(mounts.get("api-tls") == {"name": "api-tls", "mountPath": API_TLS_DIR, "readOnly": True},
             f"{where}: TLS mount {mounts.get('api-tls')}")
        sec = vols.get("api-tls", {}).get("secret", {})
        c.ok(sec.get("secretName") == tls_secret
             and [i["key"] for i in sec.get("items", [])] == ["tls.crt", "tls.key"]
             and [i["path"] for i in sec.get("items", [])] == ["tls.crt", "tls.key"],
             f"{where}: TLS volume {sec}")
    else:
        c.ok("api-tls" not in mounts and "api-tls" not in vols, f"{where}: a TLS volume without tls.existingSecret")
    # The Service: a regular one (traffic), the api port under its name.
    svc = by_kind.get("Service", {}).get(dname)
    if c.ok(svc is not None, f"{where}: no Service {dname}"):
        sspec = svc["spec"]
        c.ok("clusterIP" not in sspec and sspec.get("type") == svc_cfg["type"],
             f"{where}: Service type {sspec.get('type')} clusterIP {sspec.get('clusterIP')}")
        want_port = {"name": port_name, "port": svc_cfg["port"], "targetPort": port_name,
                     "protocol": "TCP", "appProtocol": port_name}
        c.ok(sspec["ports"] == [want_port], f"{where}: Service ports {sspec['ports']} != [{want_port}]")
        c.ok(sspec["selector"] == dep["spec"]["selector"]["matchLabels"], f"{where}: Service selector")
        c.ok(svc["metadata"].get("annotations", {}) == (svc_cfg["annotations"] or {}), f"{where}: Service annotations")
    # The Ingress: every host and path to that Service port.
    ing = by_kind.get("Ingress", {}).get(dname)
    if ing_cfg["enabled"] and c.ok(ing is not None, f"{where}: no Ingress {dname}"):
        c.ok(ing["apiVersion"] == "networking.k8s.io/v1", f"{where}: Ingress {ing['apiVersion']}")
        c.ok(ing["spec"].get("ingressClassName") == (ing_cfg["className"] or None), f"{where}: ingressClassName")
        c.ok(ing["metadata"].get("annotations", {}) == (ing_cfg["annotations"] or {}), f"{where}: Ingress annotations")
        c.ok(ing["spec"].get("tls", []) == (ing_cfg["tls"] or []), f"{where}: Ingress tls {ing['spec'].get('tls')}")
        backend = {"service": {"name": dname, "port": {"name": port_name}}}
        rules = []
        for h in ing_cfg["hosts"]:
            paths = [{"path": p["path"], "pathType": p.get("pathType") or "Prefix", "backend": backend}
                     for p in (h.get("paths") or [{"path": "/"}])]
            rules.append({"http": {"paths": paths}, **({"host": h["host"]} if h.get("host") else {})})
        c.ok(ing["spec"]["rules"] == rules, f"{where}: Ingress rules {ing['spec']['rules']} != {rules}")
    # The ServiceMonitor scrapes the api's port (https with TLS).
    for m in by_kind.get("ServiceMonitor", {}).values():
        eps = {e["port"]: e for e in m["spec"]["endpoints"]}
        c.ok(port_name in eps and eps[port_name].get("path") == "/metrics", f"{where}: ServiceMonitor lacks port {port_name}")
        if tls_secret:
            c.ok(eps.get("https", {}).get("scheme") == "https", f"{where}: ServiceMonitor scrapes the TLS port over http")


def check_api_is_additive(c: Checks, chart: helm.Chart, name: str, values: dict) -> None:
    """Turning services.api on adds its objects and changes no other one."""
    def with_api(on: bool) -> list[dict]:
        v = copy.deepcopy(values)
        v.setdefault("services", {}).setdefault("api", {})["enabled"] = on
        return render(chart, v)

    def key(d: dict) -> str:
        return f"{d['kind']}/{d['metadata']['name']}"

    def is_api(d: dict) -> bool:
        return d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "api"

    off = {key(d): d for d in with_api(False)}
    on = {key(d): d for d in with_api(True)}
    c.ok(not any(is_api(d) for d in off.values()), f"{name}: api objects rendered with services.api.enabled=false")
    rest = {k: d for k, d in on.items() if not is_api(d)}
    changed = sorted(k for k in set(off) | set(rest) if off.get(k) != rest.get(k))
    c.ok(not changed, f"{name}: turning the api on changes {changed}")
    c.ok(any(is_api(d) for d in on.values()), f"{name}: services.api.enabled=true renders no api object")


def check_cluster_specifics(c: Checks, docs: list[dict]) -> None:
    """Facts the production example (ci/cluster-values.yaml) must show."""
    deps = [d for d in docs if d["kind"] == "Deployment"]
    for d in deps:
        (ctr,) = d["spec"]["template"]["spec"]["containers"]
        env = env_of(ctr)
        where = f"cluster-values: {d['metadata']['name']}"
        c.ok(env["NOETL_REPLICAS"]["value"] == "3", f"{where}: NOETL_REPLICAS != 3")
        c.ok(env.get("NOETL_NATS_CREDS", {}).get("value") == "/etc/noetl/nats-credentials/nats.creds",
             f"{where}: NOETL_NATS_CREDS")
        c.ok(env.get("NOETL_NATS_CA", {}).get("value") == "/etc/noetl/nats-tls/ca.crt", f"{where}: NOETL_NATS_CA")
        c.ok(env.get("NOETL_OBJECT_STORE", {}).get("value", "").startswith("s3://"), f"{where}: NOETL_OBJECT_STORE")
        c.ok(env.get("OTEL_EXPORTER_OTLP_PROTOCOL", {}).get("value") == "grpc", f"{where}: OTLP over gRPC")
        vols = {x["name"]: x for x in d["spec"]["template"]["spec"]["volumes"]}
        c.ok(vols.get("nats-credentials", {}).get("secret", {}).get("secretName") == "noetl-nats-creds",
             f"{where}: creds volume")
        c.ok(d["spec"]["template"]["spec"].get("imagePullSecrets") == [{"name": "regcred"}], f"{where}: imagePullSecrets")
    kinds = {d["kind"] for d in docs}
    c.ok({"HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor", "Ingress", "Secret"} <= kinds,
         f"cluster-values: kinds {sorted(kinds)}")
    api = next((d for d in deps if d["metadata"]["name"] == f"{RELEASE}-api"), None)
    c.ok(api is not None and api["spec"].get("replicas") == 2, "cluster-values: the api runs 2 replicas")
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    c.ok(len(pdbs) == len(deps), f"cluster-values: {len(pdbs)} PDBs for {len(deps)} Deployments")
    sched = next(d for d in pdbs if d["metadata"]["name"] == f"{RELEASE}-scheduler")
    c.ok(sched["spec"] == {**sched["spec"], "minAvailable": 1} and "maxUnavailable" not in sched["spec"],
         "cluster-values: scheduler PDB override minAvailable: 1")


def check_failures(c: Checks, chart: helm.Chart) -> list[str]:
    """Values that must not render, each with the words its message must hold."""
    safe_shared = {"objectStore": {"url": "s3://b"}, "secretKey": {"existingSecret": "k"}}
    cases = [
        ("tests/unsafe-multi-replica-values.yaml", yaml.safe_load(UNSAFE.read_text()),
         ["more than one replica", "services.router.replicas=2", "executors.http.autoscaling.enabled=true",
          "objectStore.url=s3://", "secretKey.existingSecret="]),
        ("replicas 2 with S3 but no secret key", {"executors": {"http": {"replicas": 2}}, "objectStore": {"url": "s3://b"}},
         ["executors.http.replicas=2", "secretKey.existingSecret=", "openssl rand -hex 32"]),
        ("replicas 2 with the secret key but a file store",
         {"services": {"scheduler": {"replicas": 2}}, "secretKey": {"existingSecret": "k"},
          "objectStore": {"url": "file:///shared"}},
         ["services.scheduler.replicas=2", 'objectStore.url=s3://BUCKET (now "file:///shared"']),
        ("two NATS auth methods", {"nats": {"token": {"existingSecret": "t"}, "userPassword": {"existingSecret": "u"}}},
         ["one method", "nats.token.existingSecret", "nats.userPassword.existingSecret"]),
        ("HPA without a CPU request",
         {**safe_shared, "executors": {"noop": {"resources": {"requests": {"cpu": None}},
                                                "autoscaling": {"enabled": True}}}},
         ["executors.noop.resources.requests.cpu"]),
        ("autoscaling min above max", {**safe_shared, "executors": {"http": {"autoscaling": {
            "enabled": True, "minReplicas": 5, "maxReplicas": 2}}}},
         ["executors.http.autoscaling: minReplicas (5) is above maxReplicas (2)"]),
        ("client certificate without key", {"nats": {"tls": {"existingSecret": "t", "certKey": "tls.crt"}}},
         ["certKey and keyKey"]),
        ("typo in a service key (schema)", {"services": {"router": {"replica": 2}}},
         ["/services/router", "'replica' not allowed"]),
        ("unknown executor kind (schema)", {"executors": {"pyhton": {
            "replicas": 1, "concurrency": 1, "terminationGracePeriodSeconds": 1}}},
         ["invalid propertyName 'pyhton'"]),
        ("typo at the top level (schema)", {"objectstore": {"url": "s3://b"}}, ["'objectstore' not allowed"]),
        ("NOETL_REPLICAS above 5 (schema)", {"nats": {"replicas": 7}}, ["/nats/replicas"]),
        ("typo in an api key (schema)", {"services": {"api": {"enabled": True, "replica": 2}}},
         ["/services/api", "'replica' not allowed"]),
        ("typo under services.api.auth (schema)", {"services": {"api": {"auth": {"insecureNoauth": True}}}},
         ["/services/api/auth", "'insecureNoauth' not allowed"]),
        ("typo under services.api.ingress (schema)", {"services": {"api": {"ingress": {"host": "x"}}}},
         ["/services/api/ingress", "'host' not allowed"]),
        ("concurrency on the api (schema)", {"services": {"api": {"concurrency": 8}}},
         ["/services/api", "'concurrency' not allowed"]),
        ("api Service type (schema)", {"services": {"api": {"service": {"type": "Headless"}}}},
         ["/services/api/service/type"]),
        ("api insecureNoAuth with a token Secret", {"services": {"api": {
            "enabled": True, "auth": {"existingSecret": "t", "insecureNoAuth": True}}}},
         ["services.api.auth", "insecureNoAuth", "existingSecret (t", "keep one"]),
        ("api Ingress without hosts", {"services": {"api": {"enabled": True, "ingress": {"enabled": True, "hosts": []}}}},
         ["services.api.ingress.hosts"]),
        ("two api replicas without shared state", {"services": {"api": {"enabled": True, "replicas": 2}}},
         ["services.api.replicas=2", "objectStore.url=s3://", "secretKey.existingSecret="]),
    ]
    lines = []
    for what, values, needles in cases:
        try:
            render(chart, values)
        except helm.HelmError as e:
            msg = str(e)
            missing = [n for n in needles if n not in msg]
            c.ok(not missing, f"{what}: the error lacks {missing}: {msg}")
            lines.append(f"  refused as expected: {what}")
            continue
        c.ok(False, f"{what}: rendered, but must fail")
    return lines


def check_static(c: Checks, kinds: list[str]) -> None:
    """values.yaml and values.schema.json name every kind the binary serves."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    api = values["services"]["api"]
    c.ok(api["enabled"] is False and api["port"] == api["service"]["port"] == 8082,
         f"values.yaml: services.api is off by default on port 8082: {api['enabled']}, {api['port']}")
    c.ok("api" in schema["properties"]["services"]["properties"], "values.schema.json: no services.api")
    c.ok(sorted(values["executors"]) == sorted(kinds),
         f"values.yaml executors {sorted(values['executors'])} != KINDS {sorted(kinds)}")
    enum = schema["properties"]["executors"]["propertyNames"]["enum"]
    c.ok(sorted(enum) == sorted(kinds), f"values.schema.json executor kinds {enum} != KINDS {kinds}")
    for kind, timeout in task_timeouts().items():
        grace = values["executors"][kind]["terminationGracePeriodSeconds"]
        c.ok(grace > timeout, f"values.yaml: executors.{kind}.terminationGracePeriodSeconds {grace} <= task timeout {timeout}")
    # The names KEDA and docs/deploy.md use are spelled this way in the code.
    c.ok('format!("{}_WORK", self.upper())' in rust_source("crates/mesh/src/subjects.rs"),
         "subjects.rs: the work stream is no longer <PREFIX>_WORK")
    c.ok('format!("executor-{kind}")' in rust_source("services/executor/src/lib.rs"),
         "executor: the durable is no longer executor-<kind>")
    c.ok('format!("{}-{}", s.prefix(), spec.durable)' in rust_source("crates/mesh/src/topology.rs"),
         "topology.rs: durables are no longer <prefix>-<name>")


def api_variants(ci: dict[str, dict]) -> list[tuple[str, dict]]:
    """Renders with services.api on, beyond ci/cluster-values.yaml's."""
    single = copy.deepcopy(ci.get("single-values.yaml", {}))
    single["metrics"] = {"serviceMonitor": {"enabled": True}}
    single["services"] = {"api": {
        "enabled": True, "port": 8443,
        "auth": {"existingSecret": "noetl-api-bootstrap", "key": "bootstrap-token"},
        "tls": {"existingSecret": "noetl-api-tls"},
        "service": {"type": "NodePort", "port": 443, "annotations": {"example.com/team": "data"}},
        "ingress": {"enabled": True,
                    "annotations": {"nginx.ingress.kubernetes.io/backend-protocol": "HTTPS"},
                    "hosts": [{"host": ""},
                              {"host": "api.example.com",
                               "paths": [{"path": "/api", "pathType": "Exact"}, {"path": "/console"}]}]},
    }}
    return [
        ("default values + api", {"services": {"api": {"enabled": True}}}),
        ("default values + api, insecureNoAuth", {"services": {"api": {"enabled": True, "auth": {"insecureNoAuth": True}}}}),
        ("single-values.yaml + api (TLS, own token Secret, NodePort, Ingress, ServiceMonitor)", single),
    ]


def value_sets() -> list[tuple[str, dict]]:
    """Every values set the checks render: the defaults, each ci/*-values.yaml,
    the api variants. scripts/chart-commands renders the same ones."""
    ci = {p.name: yaml.safe_load(p.read_text()) or {} for p in sorted((CHART / "ci").glob("*-values.yaml"))}
    return [("default values", {})] + list(ci.items()) + api_variants(ci)


def strict_validation_works(c: Checks, docs: list[dict]) -> None:
    """A Deployment with an unknown field must fail: the validator is not a no-op."""
    bad = copy.deepcopy(next(d for d in docs if d["kind"] == "Deployment"))
    bad["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    try:
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)
        c.ok(False, "kubernetes-validate accepted an unknown field (strict mode not in effect)")
    except kubernetes_validate.ValidationError:
        c.ok(True, "")


def main() -> int:
    c = Checks()
    kinds = known_kinds()
    print(f"check_chart: {CHART.relative_to(ROOT)} (helm SDK {helm.helm_sdk_version()}, "
          f"kubernetes-validate {metadata.version('kubernetes-validate')}, "
          f"schemas {', '.join(K8S_VERSIONS)}; kinds {', '.join(kinds)})")
    check_static(c, kinds)
    chart = helm.Chart.load(str(CHART))
    inputs = value_sets()
    skipped_all: set[str] = set()
    for name, values in inputs:
        before = len(c.failures)
        check_lint(c, name, values)
        try:
            docs = render(chart, values)
        except helm.HelmError as e:
            c.ok(False, f"{name}: does not render: {e}")
            print(f"FAIL {name}: does not render")
            continue
        merged = chart.merge_values(values)
        skipped = check_schemas(c, name, docs)
        skipped_all.update(s.split("/")[0] for s in skipped)
        check_manifests(c, name, docs, merged, kinds)
        if name == "cluster-values.yaml":
            check_cluster_specifics(c, docs)
        if name == "default values":
            strict_validation_works(c, docs)
        if name in ("default values", "cluster-values.yaml"):
            check_api_is_additive(c, chart, name, values)
        kinds_count: dict[str, int] = {}
        for d in docs:
            kinds_count[d["kind"]] = kinds_count.get(d["kind"], 0) + 1
        status = "ok  " if len(c.failures) == before else "FAIL"
        summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds_count.items()))
        print(f"{status} {name}: {summary}; validated strict (Kubernetes {' and '.join(K8S_VERSIONS)})"
              + (f", skipped (CRD, no built-in schema): {', '.join(skipped)}" if skipped else ""))
    before = len(c.failures)
    lines = check_failures(c, chart)
    print(f"{'ok  ' if len(c.failures) == before else 'FAIL'} unsafe values refused ({len(lines)}):")
    print("\n".join(lines))
    if skipped_all:
        print(f"note: {', '.join(sorted(skipped_all))} are CRDs without a schema in kubernetes-validate; "
              "their fields are asserted above instead")
    for f in c.failures:
        print(f"FAIL: {f}")
    print(f"check_chart: {c.count} assertions, {len(c.failures)} failed")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
