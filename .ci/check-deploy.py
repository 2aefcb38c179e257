#!/usr/bin/env python3
"""Checks of what deploy/ ships: the plain manifests, the Helm chart and the Grafana dashboard.

    check-deploy.py render DIR   lint the chart (strict) and render it for each scenario below
                                 into DIR/SCENARIO.yaml; custom resources (the ServiceMonitor)
                                 go to DIR/custom/, which the Kubernetes schemas do not cover
    check-deploy.py check DIR    the invariants below, on deploy/kubernetes/ and on DIR's renders

The chart is linted and rendered by Helm's own engine (the helm-python-sdk package, Helm's Go
SDK as a library), offline. .ci/run validates the renders against the Kubernetes schemas
between the two steps.
"""

import json
import re
import sys
from pathlib import Path

import yaml

try:
    import tomllib
except ImportError:  # Python before 3.11
    sys.exit("check-deploy.py needs Python 3.11 or later (tomllib)")

CHART = Path("deploy/helm/svcgate")
MANIFESTS = Path("deploy/kubernetes")
KUBERNETES_VERSION = "v1.37.0"
RELEASE = "svcgate"
NAMESPACE = "svcgate"

# Values for `helm template`, one render each. Together they turn every switch of the chart.
SCENARIOS = {
    "default": {},
    "sidecar": {"mode": "sidecar"},
    "standalone-scaled": {
        "autoscaling": {"enabled": True},
        "pdb": {"enabled": True},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "adminService": {"enabled": True},
        "spool": {"existingClaim": "svcgate-spool"},
        "metrics": {"scrapeAnnotations": False},
        "tracing": {"otlpEndpoint": "http://otel-collector.observability:4318"},
    },
    "embedded-worker": {
        "worker": {
            "enabled": False,
            "smtp": {"host": "smtp-relay.mail.svc.cluster.local", "port": 587, "tls": "starttls",
                     "from": "webhooks@example.com"},
        },
        "pdb": {"enabled": False},
        "metrics": {"service": False},
    },
    "sidecar-demo": {
        "mode": "sidecar",
        "fullnameOverride": "chat-model",
        "secret": {"create": True, "storeUrl": "redis://:demo@redis:6379/0",
                   "adminToken": "demo-admin-token-0123456789abcdef"},
        "shutdown": {"graceSeconds": 10, "timeoutSeconds": 60},
        "autoscaling": {"enabled": True, "maxReplicas": 6},
        "serviceMonitor": {"enabled": True},
        "worker": {"smtp": {"host": "smtp-relay.mail.svc.cluster.local"}},
    },
}
# Kinds the Kubernetes schemas do not know.
CUSTOM_KINDS = {"ServiceMonitor"}

# svcgate's defaults for what the checks read (config/svcgate.toml, as the image ships it).
DEFAULT_SHUTDOWN_GRACE = 5
DEFAULT_SHUTDOWN_TIMEOUT = 5
FLUSH_SECONDS = 5


def fail(message):
    sys.exit(f"check-deploy: {message}")


# -- render ----------------------------------------------------------------------------------


def render(out):
    import helm_python as helm

    out = Path(out)
    (out / "custom").mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("*.yaml")) + list((out / "custom").glob("*.yaml")):
        old.unlink()
    for scenario, values in SCENARIOS.items():
        report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE,
                           kube_version=KUBERNETES_VERSION)
        # Strict: warnings count as errors; the informational ones (no icon) do not.
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        if problems:
            fail(f"helm lint --strict ({scenario}):\n" + "\n".join(map(str, problems)))
        with helm.Chart.load(CHART) as chart:
            chart.validate_schema(values)
            rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        core, custom = [], []
        for template, text in sorted(rendered.items()):
            if template.endswith("NOTES.txt"):
                continue
            for doc in yaml.safe_load_all(text):
                if doc:
                    (custom if doc["kind"] in CUSTOM_KINDS else core).append(doc)
        (out / f"{scenario}.yaml").write_text(yaml.safe_dump_all(core, sort_keys=False))
        if custom:
            (out / "custom" / f"{scenario}.yaml").write_text(yaml.safe_dump_all(custom, sort_keys=False))
    print(f"deploy/helm: lint clean, {len(SCENARIOS)} renders in {out}")


# -- check -----------------------------------------------------------------------------------


def load(*paths):
    return [d for p in paths for d in yaml.safe_load_all(Path(p).read_text()) if d]


def check_dashboard():
    dash = json.load(open("deploy/grafana/svcgate-dashboard.json"))
    src = open("src/metrics.rs").read()
    for p in dash["panels"]:
        for t in p["targets"]:
            for name in re.findall(r"svcgate_[a-z_]+", t["expr"]):
                base = re.sub(r"_(bucket|count|sum)$", "", name)
                assert f'"{base}"' in src, f"dashboard names unknown metric {name}"


def config_files(docs):
    """The svcgate.toml of each ConfigMap in `docs`, parsed, by ConfigMap name."""
    files = {}
    for d in docs:
        if d["kind"] == "ConfigMap" and "svcgate.toml" in d.get("data", {}):
            try:
                files[d["metadata"]["name"]] = tomllib.loads(d["data"]["svcgate.toml"])
            except tomllib.TOMLDecodeError as e:
                raise AssertionError(f"ConfigMap {d['metadata']['name']}: svcgate.toml: {e}")
    return files


def setting(container, pod, configs, section, key, default):
    """A setting as svcgate sees it: its variable, else the mounted file, else the default."""
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    var = f"SVCGATE_{section}_{key}".upper()
    if env.get(var) is not None:
        return env[var]
    for volume in pod.get("volumes", []):
        cm = volume.get("configMap", {}).get("name")
        if cm in configs and key in configs[cm].get(section, {}):
            return configs[cm][section][key]
    return default


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def selects_set(selector, labels):
    """A label selector with matchLabels and matchExpressions (In, NotIn, Exists)."""
    tests = [labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()]
    for e in selector.get("matchExpressions", []):
        value = labels.get(e["key"])
        tests.append({"In": lambda: value in e["values"], "NotIn": lambda: value not in e["values"],
                      "Exists": lambda: value is not None}[e["operator"]]())
    return bool(tests) and all(tests)


def check_set(where, docs, whole=True):
    """The invariants of one set of objects applied together.

    `whole`: the set holds everything applied together, so references between its objects
    (Services to pods, autoscalers to Deployments, a worker for the gateways) must resolve.
    """
    configs = config_files(docs)
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    gateways = []
    for d in deployments:
        name = d["metadata"]["name"]
        pod = d["spec"]["template"]["spec"]
        containers = {c["name"]: c for c in pod["containers"]}
        assert selects(d["spec"]["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"]), \
            f"{where}: {name}'s selector does not match its pods"
        if "svcgate" in containers:
            gateways.append(d)
            check_gateway_pod(f"{where}: {name}", pod, containers, configs)
        for c in containers.values():
            if c.get("args", [None])[0] == "worker":
                check_worker(f"{where}: {name}", c)
        # A probe must not ask the kubelet to reach a port the container listens on at
        # loopback only.
        for cname, c in containers.items():
            loopback = any("127.0.0.1:" in a for a in c.get("args", []))
            for probe in ("readinessProbe", "livenessProbe"):
                assert not (loopback and "httpGet" in c.get(probe, {})), \
                    f"{where}: {cname}'s {probe} goes to the pod's address, but it listens on loopback"

    # A Deployment an autoscaler scales names no replica count: each `kubectl apply` (or
    # `helm upgrade`) would reset it.
    scaled = {d["spec"]["scaleTargetRef"]["name"] for d in docs if d["kind"] == "HorizontalPodAutoscaler"}
    for d in deployments:
        if d["metadata"]["name"] in scaled:
            assert "replicas" not in d["spec"], f"{where}: {d['metadata']['name']} is autoscaled; drop replicas"
    if not whole:
        return

    names = {d["metadata"]["name"] for d in deployments}
    assert scaled <= names, f"{where}: an autoscaler scales no Deployment here: {sorted(scaled - names)}"
    pods = [d["spec"]["template"] for d in deployments]
    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        if kind == "Service":
            matched = [p for p in pods if selects(d["spec"]["selector"], p["metadata"]["labels"])]
            assert matched, f"{where}: Service {name} selects no pod"
            for p in matched:
                ports = {port["name"] for c in p["spec"]["containers"] for port in c.get("ports", [])}
                for port in d["spec"]["ports"]:
                    assert port["targetPort"] in ports, \
                        f"{where}: Service {name} targets port {port['targetPort']}, which its pods do not name"
        elif kind == "PodDisruptionBudget":
            assert any(selects_set(d["spec"]["selector"], p["metadata"]["labels"]) for p in pods), \
                f"{where}: PodDisruptionBudget {name} covers no pod"
        elif kind == "ServiceMonitor":
            wanted = {e["port"] for e in d["spec"]["endpoints"]}
            services = [s for s in docs if s["kind"] == "Service"
                        and selects_set(d["spec"]["selector"], s["metadata"].get("labels", {}))]
            assert any(p["name"] in wanted for s in services for p in s["spec"]["ports"]), \
                f"{where}: ServiceMonitor {name} finds no Service with a port named {sorted(wanted)}"
    # Webhooks are delivered by a worker Deployment, or by gateways that run their own.
    workers = [d for d in deployments
               if any(c.get("args", [None])[0] == "worker" for c in d["spec"]["template"]["spec"]["containers"])]
    for g in gateways:
        args = {c["name"]: c for c in g["spec"]["template"]["spec"]["containers"]}["svcgate"]["args"]
        assert workers or "--no-worker" not in args, \
            f"{where}: {g['metadata']['name']} runs serve --no-worker, and no worker delivers webhooks"


def check_gateway_pod(where, pod, containers, configs):
    gw = containers["svcgate"]
    assert gw["args"][:1] == ["serve"], f"{where}: svcgate runs {gw['args']}"
    # Probes: liveness on /healthz, readiness on /readyz, at a port the gateway listens on at
    # the pod's address.
    ports = {p["name"]: p["containerPort"] for p in gw.get("ports", [])}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = gw.get(probe, {}).get("httpGet", {})
        assert get.get("path") == path and get.get("port") == "http", \
            f"{where}: svcgate's {probe} must be GET {path} on port http"
    for port_name, key, default in (("http", "listen", "0.0.0.0:8080"),
                                    ("admin", "admin_listen", "127.0.0.1:8081"),
                                    ("metrics", "metrics_listen", "0.0.0.0:9090")):
        address = str(setting(gw, pod, configs, "server", key, default))
        if port_name in ports:
            assert address.rsplit(":", 1)[1] == str(ports[port_name]), \
                f"{where}: port {port_name} is {ports[port_name]}, but server.{key} is {address}"
            assert not address.startswith("127."), \
                f"{where}: port {port_name} is declared, but server.{key} ({address}) is loopback"
    assert "http" in ports, f"{where}: svcgate declares no port named http"
    # Shutdown timing: svcgate drains for shutdown_grace_seconds, then gives requests in flight
    # shutdown_timeout_seconds, then flushes (up to 5 s) and exits. The pod's grace period
    # must cover that, and an application in the same pod must keep serving until then (its
    # preStop).
    grace = int(setting(gw, pod, configs, "server", "shutdown_grace_seconds", DEFAULT_SHUTDOWN_GRACE))
    timeout = int(setting(gw, pod, configs, "server", "shutdown_timeout_seconds", DEFAULT_SHUTDOWN_TIMEOUT))
    needed = grace + timeout + 1 + FLUSH_SECONDS + 1
    for name, c in containers.items():
        if name == "svcgate":
            continue
        sleep = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        assert sleep[:1] == ["sleep"] and int(sleep[1]) >= grace + timeout, \
            f"{where}: {name} must keep serving {grace + timeout} s after SIGTERM (preStop sleep)"
        needed = max(needed, int(sleep[1]) + 5)
    assert pod["terminationGracePeriodSeconds"] >= needed, \
        f"{where}: terminationGracePeriodSeconds must be at least {needed}"
    # The spool outlives a container restart: a volume, not the (read-only) root filesystem.
    spool = str(setting(gw, pod, configs, "metering", "spool_dir", "data/spool"))
    mounts = [m["mountPath"] for m in gw.get("volumeMounts", [])]
    assert any(spool == m or spool.startswith(m.rstrip("/") + "/") for m in mounts), \
        f"{where}: the spool ({spool}) is on no volume"
    for ref in gw.get("envFrom", []):
        if "secretRef" in ref and not ref["secretRef"].get("optional"):
            break
    else:
        assert False, f"{where}: svcgate reads its credentials from no Secret"


def check_worker(where, c):
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = c.get(probe, {}).get("httpGet", {})
        assert get.get("path") == path and get.get("port") == "metrics", \
            f"{where}: the worker's {probe} must be GET {path} on port metrics"
    # The process that calls customers' URLs does not hold the admin token.
    for ref in c.get("envFrom", []):
        assert "secretRef" not in ref or ref["secretRef"].get("optional"), \
            f"{where}: the worker takes a whole Secret ({ref['secretRef']['name']}); only the store URL"


def check_rendered(out):
    out = Path(out)
    for scenario in SCENARIOS:
        path = out / f"{scenario}.yaml"
        assert path.exists(), f"{path} is missing: run `check-deploy.py render {out}` first"
        docs = load(path)
        custom = out / "custom" / f"{scenario}.yaml"
        if custom.exists():
            docs += load(custom)
        check_set(f"chart ({scenario})", docs)
        if scenario == "standalone-scaled":
            kinds = {d["kind"] for d in docs}
            wanted = {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                      "ServiceMonitor", "ConfigMap"}
            assert wanted <= kinds, f"chart ({scenario}) renders no {sorted(wanted - kinds)}"


def check_values_documented():
    """docs/helm.md's table lists every value that values.yaml documents (`# --`)."""
    doc = Path("docs/helm.md").read_text()
    path = []
    documented = False
    for line in (CHART / "values.yaml").read_text().splitlines():
        if line.lstrip().startswith("# --"):
            documented = True
            continue
        m = re.match(r"^( *)([A-Za-z]\w*):", line)
        if m:
            path = path[: len(m.group(1)) // 2] + [m.group(2)]
            if documented:
                key = ".".join(path)
                assert f"| `{key}` |" in doc, f"docs/helm.md's values table lacks `{key}`"
            documented = False


def check():
    out = sys.argv[2]
    # The ServiceMonitor, a custom resource, for YAML syntax; kubernetes-validate has done the
    # rest of the manifests.
    load(MANIFESTS / "servicemonitor.yaml")
    check_dashboard()
    check_set("deploy/kubernetes/sidecar.yaml", load(MANIFESTS / "sidecar.yaml"), whole=False)
    check_set("deploy/kubernetes/standalone.yaml", load(MANIFESTS / "standalone.yaml"), whole=False)
    check_set("deploy/kubernetes/worker.yaml", load(MANIFESTS / "worker.yaml"), whole=False)
    # Each gateway layout with the worker and the ServiceMonitor, as they are applied.
    for layout in ("sidecar.yaml", "standalone.yaml"):
        check_set(f"deploy/kubernetes/{layout} with worker.yaml",
                  load(MANIFESTS / layout, MANIFESTS / "worker.yaml", MANIFESTS / "servicemonitor.yaml"))
    check_rendered(out)
    check_values_documented()
    print(f"deploy/: manifests, chart ({len(SCENARIOS)} renders) and dashboard check out")


if __name__ == "__main__":
    commands = {"render": lambda: render(sys.argv[2]), "check": check}
    if len(sys.argv) != 3 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    try:
        commands[sys.argv[1]]()
    except AssertionError as e:
        fail(e)
