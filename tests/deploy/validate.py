#!/usr/bin/env python3
"""Offline validation of ferrovol's Kubernetes manifests.

    validate.py overlay DIR...   render each kustomize DIR with `kubectl kustomize` and check it
    validate.py examples DIR     check deploy/examples against the schemas and the base
    validate.py monitoring DIR   render the kustomize DIR (deploy/kubernetes/monitoring) and check
                                 its ServiceMonitor against the base's metrics Service, and its
                                 grafana-dashboard.json against the driver's metrics (the table in
                                 src/metrics.rs's module doc)
    validate.py mutations        break the rendered overlays, the examples, the monitoring
                                 directory, its dashboard and the metrics table on purpose, one
                                 way at a time, and require that every breakage is rejected by the
                                 check meant to catch it (plus the fixtures under
                                 tests/deploy/fixtures)
    validate.py preflight        report missing tools (exit 3) and nothing else

Every object is validated against the Kubernetes OpenAPI schemas that kubernetes-validate bundles,
in strict mode (unknown fields fail), for the oldest and the newest Kubernetes version named below.
CRD objects (VolumeSnapshotClass, VolumeSnapshot, ServiceMonitor) are checked against schemas
written here from the CRDs' field lists. Then the cross-references no schema sees: driver names,
the CSI socket, the registration path, RBAC per sidecar, privileges, images, resources, expansion
and attach layout, the metrics Service against the pods it selects; for monitoring, the
ServiceMonitor against that Service and the dashboard's PromQL against the driver's metrics.

Exit status: 0 all checks passed, 1 a check failed, 2 bad usage, 3 a tool is missing.
"""

import argparse
import copy
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
DEFAULT_DRIVER_NAME = "ferrovol.csi.dev"
TOPOLOGY_KEY = "topology.ferrovol.csi.dev/node"
SIDECAR_REGISTRY = "registry.k8s.io/sig-storage/"
# The oldest Kubernetes the manifests claim (deploy/kubernetes/README.md) and the newest that
# kubernetes-validate bundles; both must accept every object.
MIN_K8S_VERSION = "1.30.0"

# --------------------------------------------------------------------------------------------
# Tools


def missing_tools(kubectl, need_kubectl=True):
    """Names of the tools that are not installed, each with how to get it."""
    missing = []
    if need_kubectl and shutil.which(kubectl) is None:
        missing.append(f"kubectl ({kubectl!r} not on PATH; Debian: apt-get install kubernetes-client)")
    for module, package in (("yaml", "pyyaml"), ("kubernetes_validate", "kubernetes-validate"),
                            ("jsonschema", "jsonschema")):
        try:
            __import__(module)
        except ImportError:
            missing.append(f"python module {module} (pip install {package})")
    return missing


def fail_missing(missing):
    for m in missing:
        print(f"MISSING TOOL: {m}")
    sys.exit(3)


# --------------------------------------------------------------------------------------------
# Findings


class Findings:
    """Check failures, each tagged with the id of the check that found it."""

    def __init__(self):
        self.items = []

    def add(self, check, where, message):
        self.items.append((check, where, message))

    def checks(self):
        return {c for c, _, _ in self.items}

    def __bool__(self):
        return bool(self.items)

    def report(self, out=sys.stdout, limit=None):
        for check, where, message in self.items[:limit]:
            print(f"FAIL [{check}] {where}: {message}", file=out)


def ref(obj):
    kind = obj.get("kind", "?")
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    name = meta.get("name", "?")
    return f"{kind}/{ns}/{name}" if ns else f"{kind}/{name}"


# --------------------------------------------------------------------------------------------
# Loading


def load_yaml_docs(text, source):
    import yaml

    docs = []
    for doc in yaml.safe_load_all(text):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ValueError(f"{source}: a YAML document is not a mapping: {doc!r}")
        docs.append(doc)
    return docs


def render(kubectl, directory):
    """Objects of `kubectl kustomize DIR`, or raises RuntimeError with kubectl's message."""
    proc = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory} failed ({proc.returncode}): "
                           f"{proc.stderr.strip()}")
    return load_yaml_docs(proc.stdout, str(directory))


def load_dir(directory):
    """(file name, object) for every object in DIR/*.yaml, sorted by file name."""
    out = []
    for path in sorted(Path(directory).glob("*.yaml")):
        for doc in load_yaml_docs(path.read_text(), str(path)):
            out.append((path.name, doc))
    return out


# --------------------------------------------------------------------------------------------
# Schemas

_METADATA = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "maxLength": 253,
                 "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
        "namespace": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}

# Written from the snapshot.storage.k8s.io/v1 CRDs of external-snapshotter
# (client/config/crd): the fields a manifest may set; status is the controllers' own.
CRD_SCHEMAS = {
    ("snapshot.storage.k8s.io/v1", "VolumeSnapshotClass"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "driver", "deletionPolicy"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "snapshot.storage.k8s.io/v1"},
            "kind": {"const": "VolumeSnapshotClass"},
            "metadata": _METADATA,
            "driver": {"type": "string", "minLength": 1},
            "deletionPolicy": {"enum": ["Delete", "Retain"]},
            "parameters": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    },
    ("snapshot.storage.k8s.io/v1", "VolumeSnapshot"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "snapshot.storage.k8s.io/v1"},
            "kind": {"const": "VolumeSnapshot"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["source"],
                "additionalProperties": False,
                "properties": {
                    "volumeSnapshotClassName": {"type": "string", "minLength": 1},
                    "source": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "persistentVolumeClaimName": {"type": "string", "minLength": 1},
                            "volumeSnapshotContentName": {"type": "string", "minLength": 1},
                        },
                        # Exactly one source (the CRD's x-kubernetes-validations).
                        "oneOf": [{"required": ["persistentVolumeClaimName"]},
                                  {"required": ["volumeSnapshotContentName"]}],
                    },
                },
            },
        },
    },
}


@functools.lru_cache(maxsize=None)
def _install_schema_cache():
    """kubernetes-validate reads its schema files from disk on every call; cache them."""
    import kubernetes_validate.utils as kvu

    kvu.schema_contents = functools.lru_cache(maxsize=None)(kvu.schema_contents)
    return True


def k8s_versions():
    import kubernetes_validate

    latest = kubernetes_validate.latest_version()
    return [MIN_K8S_VERSION] if latest == MIN_K8S_VERSION else [MIN_K8S_VERSION, latest]


_schema_results = {}


def schema_errors(obj, versions):
    """(check id, message) for every schema problem of one object (cached per content)."""
    key = (tuple(versions), json.dumps(obj, sort_keys=True))
    if key in _schema_results:
        return _schema_results[key]
    errors = []
    crd = CRD_SCHEMAS.get((obj.get("apiVersion"), obj.get("kind")))
    if crd is not None:
        import jsonschema

        validator = jsonschema.Draft202012Validator(crd)
        for e in sorted(validator.iter_errors(obj), key=lambda e: list(e.path)):
            path = ".".join(str(p) for p in e.path) or "(top)"
            errors.append(("crd-schema", f"{path}: {e.message}"))
    else:
        import kubernetes_validate
        from kubernetes_validate.utils import SchemaNotFoundError

        _install_schema_cache()
        for version in versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path) or "(top)"
                errors.append(("schema", f"Kubernetes {e.version} (strict): {path}: {e.message}"))
            except SchemaNotFoundError as e:
                errors.append(("schema", f"no schema: {e.message}; add one to CRD_SCHEMAS if it "
                                         "is a custom resource"))
            except (KeyError, TypeError) as e:
                errors.append(("schema", f"not a Kubernetes object ({e!r})"))
                break
    _schema_results[key] = errors
    return errors


def check_schemas(objs, findings, versions):
    for obj in objs:
        for check, message in schema_errors(obj, versions):
            findings.add(check, ref(obj), message)


# --------------------------------------------------------------------------------------------
# Small parsers

_SEMVER_TAG = re.compile(r"^v\d+\.\d+\.\d+$")


def parse_image(image):
    """(repository, tag or None, digest or None)."""
    digest = None
    if "@" in image:
        image, digest = image.split("@", 1)
    last = image.rsplit("/", 1)[-1]
    tag = None
    if ":" in last:
        image, tag = image.rsplit(":", 1)
    return image, tag, digest


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|Ki|Mi|Gi|Ti|M|G|T)?$")
_SUFFIX = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4}


def quantity(value):
    """A Kubernetes resource quantity as a float, or None when it cannot be read."""
    m = _QUANTITY.match(str(value))
    if not m:
        return None
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def env_map(container):
    """name -> ("value", text) | ("fieldRef", fieldPath) | ("other", None)."""
    out = {}
    for e in container.get("env") or []:
        if "value" in e:
            out[e["name"]] = ("value", str(e["value"]))
        elif ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath"):
            out[e["name"]] = ("fieldRef", e["valueFrom"]["fieldRef"]["fieldPath"])
        else:
            out[e["name"]] = ("other", None)
    return out


def field_ref_token(path):
    return f"<fieldRef:{path}>"


def expand(text, env):
    """Kubernetes' $(VAR) expansion; fieldRef variables become <fieldRef:path> tokens."""

    def sub(m):
        name = m.group(1)
        if name not in env:
            return m.group(0)
        kind, value = env[name]
        if kind == "value":
            return value
        if kind == "fieldRef":
            return field_ref_token(value)
        return m.group(0)

    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, str(text))


def parse_flags(args, env):
    """({flag: value or True}, [problems]); flags must be written --name or --name=value."""
    flags, problems = {}, []
    for raw in args or []:
        arg = expand(raw, env)
        if not arg.startswith("-"):
            problems.append(f"argument {arg!r} is not a flag: write flags as --name=value")
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        if name in flags:
            problems.append(f"flag --{name} given twice")
        flags[name] = value if eq else True
    return flags, problems


def flag_true(flags, name):
    return flags.get(name) is True or str(flags.get(name)).lower() == "true"


def int_flag(container, name, default, f):
    """An integer flag's value (default when absent); None, reported, when it is no integer."""
    value = container.flags.get(name, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        f.add("flags", container.where, f"--{name}={value!r} is not a number")
        return None


# --------------------------------------------------------------------------------------------
# Workloads

SIDECAR_IMAGES = {
    "csi-provisioner": "provisioner",
    "csi-attacher": "attacher",
    "csi-resizer": "resizer",
    "csi-snapshotter": "snapshotter",
    "csi-node-driver-registrar": "registrar",
    "livenessprobe": "livenessprobe",
}
CSI_CLIENTS = ("provisioner", "attacher", "resizer", "snapshotter", "registrar", "livenessprobe")
CONTROLLER_SIDECARS = ("provisioner", "attacher", "resizer", "snapshotter")
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Pod")


class Container:
    def __init__(self, pod, raw, init=False):
        self.pod = pod
        self.raw = raw
        self.init = init
        self.name = raw.get("name", "?")
        self.image = raw.get("image", "")
        repo, _, _ = parse_image(self.image)
        base = repo.rsplit("/", 1)[-1]
        if base in SIDECAR_IMAGES:
            self.kind = SIDECAR_IMAGES[base]
        elif base == "ferrovol":
            self.kind = "ferrovol"
        else:
            self.kind = "other"
        self.env = env_map(raw)
        self.flags, self.flag_problems = parse_flags(raw.get("args"), self.env)
        if raw.get("command"):
            self.flag_problems.append("sets command: leave the image's entrypoint alone")
        self.mounts = raw.get("volumeMounts") or []

    @property
    def where(self):
        return f"{self.pod.where} container {self.name}"

    def security(self):
        return self.raw.get("securityContext") or {}

    def privileged(self):
        return bool(self.security().get("privileged"))

    # ferrovol's own settings, with the binary's defaults
    def mode(self):
        return self.flags.get("mode", "all")

    def expansion(self):
        return self.flags.get("expansion", "controller")

    def serves_node(self):
        return self.kind == "ferrovol" and self.mode() in ("all", "node")

    def serves_controller(self):
        return self.kind == "ferrovol" and self.mode() in ("all", "controller")

    def resolve(self, path):
        """(volume name, path inside the volume) for a path in this container, or None."""
        best = None
        for m in self.mounts:
            mp = m.get("mountPath", "").rstrip("/") or "/"
            if path == mp or path.startswith(mp + "/") or mp == "/":
                if best is None or len(mp) > len(best[0]):
                    best = (mp, m)
        if best is None:
            return None
        mp, m = best
        rel = path[len(mp):].lstrip("/") if mp != "/" else path.lstrip("/")
        sub = m.get("subPath")
        if sub:
            rel = f"{sub.strip('/')}/{rel}" if rel else sub.strip("/")
        return m.get("name"), rel


class PodTemplate:
    def __init__(self, owner):
        self.owner = owner
        self.kind = owner.get("kind")
        meta = owner.get("metadata") or {}
        self.name = meta.get("name", "?")
        self.namespace = meta.get("namespace")
        spec = owner.get("spec") or {}
        if self.kind == "Pod":
            self.spec = spec
            self.replicas = 1
        else:
            self.spec = ((spec.get("template") or {}).get("spec")) or {}
            self.replicas = spec.get("replicas", 1)
        self.volumes = {v.get("name"): v for v in self.spec.get("volumes") or []}
        self.containers = [Container(self, c) for c in self.spec.get("containers") or []]
        self.containers += [Container(self, c, init=True)
                            for c in self.spec.get("initContainers") or []]

    @property
    def where(self):
        return f"{self.kind}/{self.namespace}/{self.name}" if self.namespace else \
            f"{self.kind}/{self.name}"

    def of_kind(self, kind):
        return [c for c in self.containers if c.kind == kind]

    def ferrovol(self):
        found = self.of_kind("ferrovol")
        return found[0] if len(found) == 1 else None

    def host_path(self, volume_name):
        v = self.volumes.get(volume_name) or {}
        hp = v.get("hostPath")
        return hp.get("path").rstrip("/") if hp and hp.get("path") else None

    def service_account(self):
        return self.spec.get("serviceAccountName") or self.spec.get("serviceAccount") or "default"


def pods_of(objs):
    return [PodTemplate(o) for o in objs if o.get("kind") in WORKLOAD_KINDS]


def csi_address(container):
    value = container.flags.get("csi-address")
    if not isinstance(value, str) or not value:
        return None
    return value[len("unix://"):] if value.startswith("unix://") else value


def endpoint_path(ferrovol):
    value = ferrovol.flags.get("endpoint")
    if value is None and ferrovol.env.get("CSI_ENDPOINT", ("", ""))[0] == "value":
        value = ferrovol.env["CSI_ENDPOINT"][1]
    if not isinstance(value, str) or not value.startswith("unix:///"):
        return None
    return value[len("unix://"):]


# --------------------------------------------------------------------------------------------
# Checks on a rendered deployment

CLUSTER_SCOPED = {"Namespace", "CSIDriver", "StorageClass", "ClusterRole", "ClusterRoleBinding",
                  "VolumeSnapshotClass", "PriorityClass", "PersistentVolume",
                  "CustomResourceDefinition"}


def one(objs, kind):
    return [o for o in objs if o.get("kind") == kind]


def check_namespaces(objs, f):
    namespaces = [o["metadata"]["name"] for o in one(objs, "Namespace")]
    if len(namespaces) != 1:
        f.add("namespace", "deployment", f"expected one Namespace, found {namespaces}")
        return
    ns = namespaces[0]
    for o in objs:
        meta = o.get("metadata") or {}
        if o.get("kind") in CLUSTER_SCOPED:
            if "namespace" in meta:
                f.add("namespace", ref(o), "cluster-scoped object names a namespace")
        elif meta.get("namespace") != ns:
            f.add("namespace", ref(o), f"namespaced object must be in namespace {ns!r}")


def driver_name_of(ferrovol):
    return ferrovol.flags.get("driver-name", DEFAULT_DRIVER_NAME)


def check_driver_names(objs, pods, f):
    drivers = one(objs, "CSIDriver")
    if len(drivers) != 1:
        f.add("driver-name", "deployment", f"expected one CSIDriver, found {len(drivers)}")
        return None
    name = drivers[0]["metadata"]["name"]
    ferrovols = [c for p in pods for c in p.of_kind("ferrovol")]
    if not ferrovols:
        f.add("driver-name", "deployment", "no ferrovol container")
    for c in ferrovols:
        if driver_name_of(c) != name:
            f.add("driver-name", c.where,
                  f"--driver-name {driver_name_of(c)!r} differs from the CSIDriver {name!r}")
    classes = one(objs, "StorageClass")
    if not classes:
        f.add("driver-name", "deployment", "no StorageClass")
    for sc in classes:
        if sc.get("provisioner") != name:
            f.add("driver-name", ref(sc),
                  f"provisioner {sc.get('provisioner')!r} differs from the CSIDriver {name!r}")
    snapclasses = one(objs, "VolumeSnapshotClass")
    if not snapclasses:
        f.add("driver-name", "deployment", "no VolumeSnapshotClass")
    for vsc in snapclasses:
        if vsc.get("driver") != name:
            f.add("driver-name", ref(vsc),
                  f"driver {vsc.get('driver')!r} differs from the CSIDriver {name!r}")
    return drivers[0]


FS_TYPES = {"ext4", "xfs", "btrfs"}
K8S_PREFIX = "csi.storage.k8s.io/"


def check_storage_classes(objs, f):
    fstypes = set()
    for sc in one(objs, "StorageClass"):
        params = sc.get("parameters") or {}
        for key, value in params.items():
            if key == "backend":
                if value != "loop":
                    f.add("storageclass", ref(sc), f"backend {value!r}: the node runs 'loop'")
            elif not key.startswith(K8S_PREFIX):
                f.add("storageclass", ref(sc),
                      f"parameter {key!r} is unknown to ferrovol (CreateVolume would fail with "
                      "INVALID_ARGUMENT)")
        if params.get("backend") != "loop":
            f.add("storageclass", ref(sc), "parameters must name backend: loop")
        fstype = params.get(K8S_PREFIX + "fstype")
        if fstype is not None and fstype not in FS_TYPES:
            f.add("storageclass", ref(sc), f"fstype {fstype!r} is not one of {sorted(FS_TYPES)}")
        fstypes.add(fstype or "ext4")
        if sc.get("volumeBindingMode") != "WaitForFirstConsumer":
            f.add("storageclass", ref(sc),
                  "volumeBindingMode must be WaitForFirstConsumer: a volume lives on one node")
        if sc.get("allowVolumeExpansion") is not True:
            f.add("storageclass", ref(sc), "allowVolumeExpansion must be true")
    for wanted in ("ext4", "xfs"):
        if wanted not in fstypes:
            f.add("storageclass", "deployment", f"no StorageClass for {wanted}")


def check_images(pods, f):
    for p in pods:
        for c in p.containers:
            repo, tag, digest = parse_image(c.image)
            if not c.image:
                f.add("image", c.where, "no image")
                continue
            if tag is None and digest is None:
                f.add("image", c.where, f"{c.image!r} is not pinned: no tag or digest")
            if tag == "latest":
                f.add("image", c.where, f"{c.image!r} uses :latest")
            if c.kind in SIDECAR_IMAGES.values():
                if not repo.startswith(SIDECAR_REGISTRY):
                    f.add("image", c.where, f"{c.image!r}: sidecars come from {SIDECAR_REGISTRY}")
                if digest is None and not (tag and _SEMVER_TAG.match(tag)):
                    f.add("image", c.where, f"{c.image!r}: pin a release tag vX.Y.Z")
            if c.kind == "other" and p.kind != "Pod":
                f.add("image", c.where, f"{c.image!r} is neither ferrovol nor a known CSI sidecar")


def check_resources(pods, f):
    for p in pods:
        for c in p.containers:
            res = c.raw.get("resources") or {}
            for part in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    if r not in (res.get(part) or {}):
                        f.add("resources", c.where, f"no {part}.{r}")
            for r in ("cpu", "memory"):
                req = quantity((res.get("requests") or {}).get(r))
                lim = quantity((res.get("limits") or {}).get(r))
                if req is not None and lim is not None and req > lim:
                    f.add("resources", c.where, f"requests.{r} exceeds limits.{r}")


def check_privileges(pods, f):
    for p in pods:
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if p.spec.get(key):
                f.add("privilege", p.where, f"{key} is not needed")
        for c in p.containers:
            bidirectional = [m.get("name") for m in c.mounts
                             if m.get("mountPropagation") == "Bidirectional"]
            caps = ((c.security().get("capabilities") or {}).get("add")) or []
            if c.serves_node():
                if not c.privileged():
                    f.add("privilege", c.where,
                          "the node service mounts and sets up loop devices: privileged: true")
                if not bidirectional:
                    f.add("privilege", c.where,
                          "needs a Bidirectional mount of /var/lib/kubelet for its mounts")
                continue
            if c.privileged():
                f.add("privilege", c.where, "privileged, but only the node-serving ferrovol is")
            if bidirectional:
                f.add("privilege", c.where,
                      f"Bidirectional propagation on {bidirectional}: only the node-serving "
                      "ferrovol mounts")
            if caps:
                f.add("privilege", c.where, f"adds capabilities {caps}")
            if c.security().get("allowPrivilegeEscalation") is not False:
                f.add("privilege", c.where, "set allowPrivilegeEscalation: false")


FERROVOL_FLAGS = {
    "endpoint": None, "node-id": None, "driver-name": None, "state-dir": None,
    "pool-dir": None, "mode": {"all", "controller", "node"},
    "expansion": {"controller", "node"}, "metrics-address": None,
    "max-volumes-per-node": "uint", "default-fs-type": FS_TYPES,
    "log-format": {"text", "json"}, "tool-timeout-secs": "posint",
}


def check_ferrovol_flags(pods, f):
    for p in pods:
        for c in p.containers:
            for problem in c.flag_problems:
                f.add("flags", c.where, problem)
            if c.kind != "ferrovol":
                continue
            for name, value in c.flags.items():
                if name not in FERROVOL_FLAGS:
                    f.add("flags", c.where, f"ferrovol has no flag --{name}")
                    continue
                allowed = FERROVOL_FLAGS[name]
                if value is True:
                    f.add("flags", c.where, f"--{name} needs a value")
                elif isinstance(allowed, set) and value not in allowed:
                    f.add("flags", c.where, f"--{name}={value!r}: one of {sorted(allowed)}")
                elif allowed == "uint" and not str(value).isdigit():
                    f.add("flags", c.where, f"--{name}={value!r}: a count")
                elif allowed == "posint" and not (str(value).isdigit() and int(value) > 0):
                    f.add("flags", c.where, f"--{name}={value!r}: a positive number")


def check_sidecar_flags(pods, f):
    for p in pods:
        for c in p.containers:
            if c.kind in CONTROLLER_SIDECARS and "timeout" not in c.flags:
                f.add("sidecar-flags", c.where, "set --timeout: mkfs and copies outlast the 15s "
                                                "default")
            if c.kind == "provisioner":
                gates = str(c.flags.get("feature-gates", ""))
                if "Topology=true" not in gates.split(","):
                    f.add("sidecar-flags", c.where, "needs --feature-gates=Topology=true")
                if not flag_true(c.flags, "extra-create-metadata"):
                    f.add("sidecar-flags", c.where, "needs --extra-create-metadata")
                if not flag_true(c.flags, "strict-topology"):
                    f.add("sidecar-flags", c.where,
                          "needs --strict-topology=true: a volume can only be on the pod's node")


def check_sockets(pods, f):
    """Every CSI client reaches the very file ferrovol serves, through the same volume."""
    for p in pods:
        clients = [c for c in p.containers if c.kind in CSI_CLIENTS]
        ferrovols = p.of_kind("ferrovol")
        if not ferrovols:
            for c in clients:
                f.add("socket", c.where, "no ferrovol container in this pod to talk to")
            continue
        if len(ferrovols) > 1:
            f.add("socket", p.where, "more than one ferrovol container")
            continue
        fv = ferrovols[0]
        path = endpoint_path(fv)
        if path is None:
            f.add("socket", fv.where, "--endpoint must be unix:///<absolute path>")
            continue
        served = fv.resolve(path)
        if served is None:
            f.add("socket", fv.where, f"socket {path} is on no volume: sidecars cannot reach it")
            continue
        for c in clients:
            addr = csi_address(c)
            if addr is None:
                f.add("socket", c.where, "no --csi-address")
                continue
            got = c.resolve(addr)
            if got != served:
                f.add("socket", c.where,
                      f"--csi-address {addr} is {got} (volume, file), but ferrovol serves {served}")


KUBELET_PLUGINS = "/var/lib/kubelet/plugins"
REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"


def check_registrar(pods, driver, f):
    name = driver["metadata"]["name"] if driver else DEFAULT_DRIVER_NAME
    for p in pods:
        fv = p.ferrovol()
        registrars = p.of_kind("registrar")
        if fv is None:
            continue
        if fv.serves_node() and len(registrars) != 1:
            f.add("registrar", p.where,
                  "a node-serving ferrovol needs one node-driver-registrar, or kubelet never "
                  "learns of it")
        if not fv.serves_node() and registrars:
            f.add("registrar", p.where, "registers a ferrovol that serves no node service")
        path = endpoint_path(fv)
        served = fv.resolve(path) if path else None
        for r in registrars:
            if served is None:
                continue
            host_dir = p.host_path(served[0])
            if host_dir is None:
                f.add("registrar", r.where, f"the socket volume {served[0]} is not a hostPath: "
                                            "kubelet cannot reach the socket")
                continue
            if host_dir != f"{KUBELET_PLUGINS}/{name}":
                f.add("registrar", p.where,
                      f"socket volume hostPath {host_dir} should be {KUBELET_PLUGINS}/{name}")
            expected = f"{host_dir}/{served[1]}"
            got = r.flags.get("kubelet-registration-path")
            if got != expected:
                f.add("registrar", r.where,
                      f"--kubelet-registration-path={got} but the socket is at {expected} on the "
                      "host")
            reg = r.resolve("/registration")
            if reg is None or reg[1] != "" or p.host_path(reg[0]) != REGISTRY_DIR:
                f.add("registrar", r.where, f"mount hostPath {REGISTRY_DIR} at /registration")


def check_host_paths(pods, f):
    allowed_sidecar_host = {REGISTRY_DIR}
    for p in pods:
        fv = p.ferrovol()
        socket_volume = None
        if fv is not None and endpoint_path(fv):
            served = fv.resolve(endpoint_path(fv))
            socket_volume = served[0] if served else None
        for c in p.containers:
            if c.kind == "ferrovol":
                continue
            for m in c.mounts:
                hp = p.host_path(m.get("name"))
                if hp and m.get("name") != socket_volume and hp not in allowed_sidecar_host:
                    f.add("host-paths", c.where, f"mounts host path {hp}")
        if fv is None:
            continue
        for flag in ("state-dir", "pool-dir"):
            value = fv.flags.get(flag)
            if not isinstance(value, str) or not value.startswith("/"):
                f.add("host-paths", fv.where, f"set --{flag} to an absolute path")
                continue
            where = fv.resolve(value)
            volume = p.volumes.get(where[0]) if where else None
            if fv.serves_node():
                if volume is None or p.host_path(where[0]) != "/var/lib/ferrovol":
                    f.add("host-paths", fv.where,
                          f"--{flag}={value} must be on the hostPath /var/lib/ferrovol: volumes "
                          "outlive the pod")
            elif volume is None or "emptyDir" not in volume:
                f.add("host-paths", fv.where,
                      f"--{flag}={value}: a controller-only ferrovol keeps no volumes; use an "
                      "emptyDir")
        if fv.serves_node():
            mounts = {m.get("mountPath", "").rstrip("/"): m for m in fv.mounts}
            kubelet = mounts.get("/var/lib/kubelet")
            if kubelet is None or p.host_path(kubelet.get("name")) != "/var/lib/kubelet" or \
                    kubelet.get("mountPropagation") != "Bidirectional":
                f.add("host-paths", fv.where,
                      "mount hostPath /var/lib/kubelet at /var/lib/kubelet, Bidirectional")
            dev = mounts.get("/dev")
            if dev is None or p.host_path(dev.get("name")) != "/dev":
                f.add("host-paths", fv.where, "mount hostPath /dev at /dev (loop devices)")
        else:
            for m in fv.mounts:
                if p.host_path(m.get("name")):
                    f.add("host-paths", fv.where,
                          f"a controller-only ferrovol mounts host path {p.host_path(m['name'])}")


def check_node_ids(pods, f):
    token = field_ref_token("spec.nodeName")
    for p in pods:
        fv = p.ferrovol()
        if fv is None or not fv.serves_node():
            continue
        if "node-id" in fv.flags:
            ok = fv.flags["node-id"] == token
        else:
            ok = fv.env.get("NODE_ID") == ("fieldRef", "spec.nodeName")
        if not ok:
            f.add("node-id", fv.where,
                  "the node id must be the node's name (downward API spec.nodeName): it is the "
                  f"value of {TOPOLOGY_KEY}")


def listen_port(value):
    m = re.match(r"^(?:[0-9.]*|\[[0-9a-fA-F:]*\]):(\d+)$", str(value))
    return int(m.group(1)) if m else None


def check_liveness_and_ports(pods, f):
    for p in pods:
        if p.kind == "Pod":
            continue
        listeners = []  # (port, who)
        probes = p.of_kind("livenessprobe")
        for lp in probes:
            listeners.append((int_flag(lp, "health-port", 9808, f), lp.where))
        for r in p.of_kind("registrar"):
            if "http-endpoint" in r.flags:
                listeners.append((listen_port(r.flags["http-endpoint"]), r.where))
        for c in p.containers:
            if c.kind in CONTROLLER_SIDECARS:
                for flag in ("http-endpoint", "metrics-address"):
                    if flag in c.flags:
                        listeners.append((listen_port(c.flags[flag]), c.where))
        fv = p.ferrovol()
        if fv is not None:
            metrics = fv.flags.get("metrics-address")
            port = listen_port(metrics) if metrics else None
            if port is None or not str(metrics).startswith("0.0.0.0:"):
                f.add("metrics", fv.where,
                      "--metrics-address=0.0.0.0:PORT, so Prometheus and probes reach it")
            else:
                listeners.append((port, fv.where))
                named = [cp for cp in fv.raw.get("ports") or [] if cp.get("name") == "metrics"]
                if len(named) != 1 or named[0].get("containerPort") != port:
                    f.add("metrics", fv.where,
                          f"declare containerPort {port} named 'metrics' for --metrics-address")
            # Liveness: kubelet -> healthz port (the livenessprobe sidecar) -> Probe RPC.
            probe = (fv.raw.get("livenessProbe") or {}).get("httpGet") or {}
            healthz = [cp for cp in fv.raw.get("ports") or [] if cp.get("name") == "healthz"]
            if probe.get("port") != "healthz" or len(healthz) != 1:
                f.add("liveness", fv.where,
                      "livenessProbe.httpGet.port must be the container port named 'healthz'")
            elif len(probes) != 1:
                f.add("liveness", p.where,
                      "one livenessprobe sidecar must serve the healthz port (it calls Probe)")
            elif int_flag(probes[0], "health-port", 9808, Findings()) != \
                    healthz[0].get("containerPort"):
                f.add("liveness", fv.where,
                      f"healthz port {healthz[0].get('containerPort')} is not the livenessprobe's "
                      f"--health-port {probes[0].flags.get('health-port', 9808)}")
        listened = {port for port, _ in listeners}
        seen = {}
        for port, who in listeners:
            if port is None:
                f.add("ports", who, "cannot read the listen address")
            elif port in seen:
                f.add("ports", who, f"port {port} is also taken by {seen[port]}")
            else:
                seen[port] = who
        for c in p.containers:
            for cp in c.raw.get("ports") or []:
                if cp.get("containerPort") not in listened:
                    f.add("ports", c.where,
                          f"containerPort {cp.get('containerPort')} ({cp.get('name')}) has no "
                          "listener")


def check_layout(objs, pods, driver, f):
    """Expansion, attach, node deployment, leader election and capacity: how the pieces fit."""
    daemon_ferrovols = [c for p in pods if p.kind == "DaemonSet" for c in p.of_kind("ferrovol")]
    all_ferrovols = [c for p in pods for c in p.of_kind("ferrovol")]
    resizers = [c for p in pods for c in p.of_kind("resizer")]
    attachers = [c for p in pods for c in p.of_kind("attacher")]
    provisioners = [c for p in pods for c in p.of_kind("provisioner")]

    # expansion
    if not resizers and any(sc.get("allowVolumeExpansion") for sc in one(objs, "StorageClass")):
        f.add("expansion", "deployment", "classes allow expansion but no csi-resizer runs")
    if daemon_ferrovols:
        for c in all_ferrovols:
            if c.expansion() != "node":
                f.add("expansion", c.where,
                      "with one ferrovol per node, storage grows on its node: --expansion=node")
    for r in resizers:
        fv = r.pod.ferrovol()
        if fv is None:
            continue
        if not fv.serves_controller():
            f.add("expansion", r.where, "csi-resizer needs a ferrovol serving the controller")
        elif fv.mode() == "controller" and fv.expansion() != "node":
            f.add("expansion", fv.where,
                  "a controller-only ferrovol cannot reach node-local storage: --expansion=node")
    for p in pods:
        fv = p.ferrovol()
        if p.kind == "Deployment" and fv is not None and fv.mode() != "controller":
            f.add("expansion", fv.where,
                  "a Deployment's ferrovol holds no node's storage: --mode=controller")

    # controller sidecars that touch volumes need the ferrovol that holds them
    for c in provisioners + attachers + [c for p in pods for c in p.of_kind("snapshotter")]:
        fv = c.pod.ferrovol()
        if fv is not None and fv.mode() != "all":
            f.add("controller-placement", c.where,
                  f"{c.kind} calls controller RPCs that touch node-local storage: it needs a "
                  f"--mode=all ferrovol beside it, not --mode={fv.mode()}")

    # attach
    attach_required = True if driver is None else \
        (driver.get("spec") or {}).get("attachRequired", True)
    if attach_required and not attachers:
        f.add("attach", "deployment", "CSIDriver attachRequired is true but no csi-attacher runs: "
                                      "every pod would wait for attachment forever")
    if not attach_required and attachers:
        f.add("attach", "deployment", "csi-attacher runs but CSIDriver attachRequired is false")

    # node deployment and leader election
    for p in pods:
        for c in p.containers:
            if c.kind not in CONTROLLER_SIDECARS:
                continue
            leader = flag_true(c.flags, "leader-election")
            node_deployment = flag_true(c.flags, "node-deployment")
            if p.kind == "DaemonSet":
                if c.kind not in ("provisioner", "snapshotter"):
                    f.add("node-deployment", c.where,
                          f"{c.kind} has no node-deployment mode: one copy per node would race")
                    continue
                if not node_deployment:
                    f.add("node-deployment", c.where,
                          "one per node: needs --node-deployment=true")
                if c.env.get("NODE_NAME") != ("fieldRef", "spec.nodeName"):
                    f.add("node-deployment", c.where,
                          "needs env NODE_NAME from the downward API spec.nodeName")
                if leader:
                    f.add("leader-election", c.where,
                          "per-node sidecars must not elect a leader (it exits with "
                          "--node-deployment)")
            else:
                if node_deployment:
                    f.add("node-deployment", c.where, "--node-deployment outside a DaemonSet")
                if (p.kind == "Deployment" or p.replicas != 1) and not leader:
                    f.add("leader-election", c.where,
                          f"a {p.kind} can run several copies: needs --leader-election")
    for p in pods:
        fv = p.ferrovol()
        if fv is None or not fv.serves_node() or p.kind == "DaemonSet":
            continue
        if p.replicas != 1:
            f.add("pinning", p.where, "a node-serving ferrovol outside a DaemonSet: replicas 1")
        selector = {k: v for k, v in (p.spec.get("nodeSelector") or {}).items()
                    if k != "kubernetes.io/os"}
        affinity = ((p.spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution")
        if not selector and not affinity and not p.spec.get("nodeName"):
            f.add("pinning", p.where,
                  "pin the pod to its node (nodeSelector or node affinity): its volumes stay there")

    # capacity tracking
    capacity = [c for c in provisioners if flag_true(c.flags, "enable-capacity")]
    storage_capacity = bool(driver and (driver.get("spec") or {}).get("storageCapacity"))
    if storage_capacity and not capacity:
        f.add("capacity", "deployment",
              "CSIDriver storageCapacity is true but no provisioner publishes capacity")
    if capacity and not storage_capacity:
        f.add("capacity", "deployment",
              "a provisioner publishes capacity but CSIDriver storageCapacity is false")
    for c in capacity:
        ns = c.env.get("NAMESPACE") or c.env.get("POD_NAMESPACE")
        if ns != ("fieldRef", "metadata.namespace"):
            f.add("capacity", c.where, "needs env NAMESPACE from metadata.namespace")
        level = int_flag(c, "capacity-ownerref-level", 1, f)
        if level is None:
            continue
        if level >= 0 and c.env.get("POD_NAME") != ("fieldRef", "metadata.name"):
            f.add("capacity", c.where, "needs env POD_NAME from metadata.name")
        fitting = {"DaemonSet": {0, 1}, "StatefulSet": {0, 1}, "Deployment": {0, 2}}.get(
            c.pod.kind, {0})
        if level not in fitting:
            f.add("capacity", c.where,
                  f"--capacity-ownerref-level={level} does not reach the {c.pod.kind} from its "
                  f"pod (use one of {sorted(fitting)})")


# RBAC: what each sidecar needs, after the rbac files of the sidecars' repositories
# (external-provisioner deploy/kubernetes/rbac.yaml v6, external-attacher deploy/kubernetes/
# rbac.yaml v4, external-resizer deploy/kubernetes/rbac.yaml v2, external-snapshotter
# deploy/kubernetes/csi-snapshotter/rbac-csi-snapshotter.yaml v8). Secrets are left out:
# ferrovol uses no secrets. node-driver-registrar and livenessprobe use no API.


def _rules(*specs):
    out = set()
    for group, resources, verbs in specs:
        for resource in resources.split():
            for verb in verbs.split():
                out.add((group, resource, verb))
    return frozenset(out)


CLUSTER_NEEDS = {
    "provisioner": _rules(
        ("", "persistentvolumes", "get list watch create patch delete"),
        ("", "persistentvolumeclaims", "get list watch update"),
        ("storage.k8s.io", "storageclasses", "get list watch"),
        ("", "events", "list watch create update patch"),
        ("snapshot.storage.k8s.io", "volumesnapshots", "get list watch update"),
        ("snapshot.storage.k8s.io", "volumesnapshotcontents", "get list"),
        ("storage.k8s.io", "csinodes", "get list watch"),
        ("", "nodes", "get list watch"),
        # ferrovol has PUBLISH_UNPUBLISH_VOLUME: the provisioner watches VolumeAttachments.
        ("storage.k8s.io", "volumeattachments", "get list watch"),
    ),
    "attacher": _rules(
        ("", "persistentvolumes", "get list watch patch"),
        ("storage.k8s.io", "csinodes", "get list watch"),
        ("storage.k8s.io", "volumeattachments", "get list watch patch"),
        ("storage.k8s.io", "volumeattachments/status", "patch"),
    ),
    "resizer": _rules(
        ("", "persistentvolumes", "get list watch patch"),
        ("", "persistentvolumeclaims", "get list watch"),
        ("", "persistentvolumeclaims/status", "patch"),
        ("", "pods", "get list watch"),
        ("", "events", "list watch create update patch"),
        ("storage.k8s.io", "volumeattributesclasses", "get list watch"),
    ),
    "snapshotter": _rules(
        ("", "events", "list watch create update patch"),
        ("snapshot.storage.k8s.io", "volumesnapshotclasses", "get list watch"),
        ("snapshot.storage.k8s.io", "volumesnapshotcontents", "get list watch update patch"),
        ("snapshot.storage.k8s.io", "volumesnapshotcontents/status", "update patch"),
        ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotclasses", "get list watch"),
        ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents",
         "get list watch update patch"),
        ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents/status", "update patch"),
    ),
}
LEASES = _rules(("coordination.k8s.io", "leases", "get watch list delete update create"))
CAPACITY = _rules(("storage.k8s.io", "csistoragecapacities",
                   "get list watch create update patch delete"))


def namespaced_needs(c):
    """Rules a sidecar needs in its own namespace."""
    need = set()
    if c.kind in CONTROLLER_SIDECARS and flag_true(c.flags, "leader-election"):
        need |= LEASES
    if c.kind == "provisioner" and flag_true(c.flags, "enable-capacity"):
        need |= CAPACITY
        level = int_flag(c, "capacity-ownerref-level", 1, Findings()) or 0
        if level >= 0:
            need |= _rules(("", "pods", "get"))  # the pod's own owner references
        if level >= 2:
            need |= _rules(("apps", "replicasets", "get"))  # pod -> ReplicaSet -> Deployment
    return need


def rule_triples(role, f):
    out = set()
    for rule in role.get("rules") or []:
        if rule.get("resourceNames") or rule.get("nonResourceURLs"):
            f.add("rbac", ref(role), "resourceNames/nonResourceURLs are not expected here")
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    if "*" in (group, resource, verb):
                        f.add("rbac", ref(role), "wildcards grant more than any sidecar needs")
                    out.add((group, resource, verb))
    return out


def fmt_rules(triples):
    by = {}
    for g, r, v in sorted(triples):
        by.setdefault((g, r), []).append(v)
    return "; ".join(f"{g or 'core'}/{r}: {','.join(vs)}" for (g, r), vs in by.items())


def check_rbac(objs, pods, f):
    cluster_roles = {o["metadata"]["name"]: o for o in one(objs, "ClusterRole")}
    roles = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in one(objs, "Role")}
    accounts = {(o["metadata"].get("namespace"), o["metadata"]["name"])
                for o in one(objs, "ServiceAccount")}

    # One ClusterRole per sidecar, each exactly that sidecar's rules.
    for name, role in cluster_roles.items():
        triples = rule_triples(role, f)
        if not any(triples == need for need in CLUSTER_NEEDS.values()):
            sidecar, need = min(CLUSTER_NEEDS.items(), key=lambda kv: len(kv[1] ^ triples))
            f.add("rbac", ref(role),
                  f"is not exactly one sidecar's rules (closest: {sidecar}; missing: "
                  f"{fmt_rules(need - triples) or '-'}; extra: {fmt_rules(triples - need) or '-'})")

    grants = {}  # service account -> {"cluster": set, namespace: set}
    bound = set()
    for b in one(objs, "ClusterRoleBinding") + one(objs, "RoleBinding"):
        rr = b.get("roleRef") or {}
        ns = b["metadata"].get("namespace")
        if rr.get("kind") == "ClusterRole":
            role = cluster_roles.get(rr.get("name"))
        else:
            role = roles.get((ns, rr.get("name")))
        if role is None:
            f.add("rbac", ref(b), f"binds {rr.get('kind')} {rr.get('name')!r}, which is not here")
            continue
        bound.add(id(role))
        scope = "cluster" if b["kind"] == "ClusterRoleBinding" else ns
        triples = rule_triples(role, Findings())
        for s in b.get("subjects") or []:
            if s.get("kind") != "ServiceAccount":
                f.add("rbac", ref(b), f"subject {s} is not a ServiceAccount")
                continue
            account = (s.get("namespace"), s.get("name"))
            if account not in accounts:
                f.add("rbac", ref(b), f"subject ServiceAccount {account[0]}/{account[1]} is not here")
            grants.setdefault(account, {}).setdefault(scope, set()).update(triples)
    for role in list(cluster_roles.values()) + list(roles.values()):
        if id(role) not in bound:
            f.add("rbac", ref(role), "is bound to no service account")

    needs = {}  # service account -> {"cluster": set, namespace: set}
    for p in pods:
        account = (p.namespace, p.service_account())
        if p.kind != "Pod" and account not in accounts:
            f.add("rbac", p.where, f"uses ServiceAccount {account[1]!r}, which is not here")
        entry = needs.setdefault(account, {"cluster": set(), p.namespace: set()})
        entry.setdefault(p.namespace, set())
        for c in p.containers:
            entry["cluster"] |= CLUSTER_NEEDS.get(c.kind, set())
            entry[p.namespace] |= namespaced_needs(c)

    for account, need in needs.items():
        have = grants.get(account, {})
        have_cluster = have.get("cluster", set())
        who = f"ServiceAccount {account[0]}/{account[1]}"
        missing = need["cluster"] - have_cluster
        if missing:
            f.add("rbac", who, f"its sidecars need {fmt_rules(missing)}")
        for scope, triples in need.items():
            if scope == "cluster":
                continue
            missing = triples - have_cluster - have.get(scope, set())
            if missing:
                f.add("rbac", who, f"its sidecars need, in namespace {scope}: {fmt_rules(missing)}")
        extra = have_cluster - need["cluster"]
        if extra:
            f.add("rbac", who, f"is granted cluster-wide what none of its sidecars needs: "
                               f"{fmt_rules(extra)}")
        for scope, triples in have.items():
            if scope == "cluster":
                continue
            extra = triples - need.get(scope, set())
            if extra:
                f.add("rbac", who, f"is granted in namespace {scope} what none of its sidecars "
                                   f"needs: {fmt_rules(extra)}")
    for account in grants:
        if account not in needs:
            f.add("rbac", f"ServiceAccount {account[0]}/{account[1]}",
                  "has grants but no pod uses it")


def template_labels(owner):
    """The labels a workload gives its pods."""
    if owner.get("kind") == "Pod":
        return (owner.get("metadata") or {}).get("labels") or {}
    template = (owner.get("spec") or {}).get("template") or {}
    return (template.get("metadata") or {}).get("labels") or {}


def selector_matches(selector, labels):
    """A Kubernetes label selector (matchLabels and matchExpressions) against labels."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


METRICS_PORT = "metrics"


def metrics_services(objs):
    """Services labelled app.kubernetes.io/component: metrics (base/metrics-service.yaml)."""
    return [o for o in one(objs, "Service")
            if ((o.get("metadata") or {}).get("labels") or {}).get(
                "app.kubernetes.io/component") == "metrics"]


def check_metrics_service(objs, pods, f):
    """The headless Service Prometheus discovers the drivers through: it selects every pod that
    runs ferrovol and only those, and its ports reach the port --metrics-address listens on."""
    services = metrics_services(objs)
    if len(services) != 1:
        f.add("metrics-service", "deployment",
              f"expected one Service labelled app.kubernetes.io/component: metrics (the "
              f"ServiceMonitor selects it), found {len(services)}")
        return
    svc = services[0]
    where = ref(svc)
    spec = svc.get("spec") or {}
    if spec.get("clusterIP") != "None":
        f.add("metrics-service", where, "must be headless (clusterIP: None): Prometheus scrapes "
                                        "each driver, not one picked by a load balancer")
    selector = spec.get("selector") or {}
    if not selector:
        f.add("metrics-service", where, "has no selector: no pod would be scraped")
        return
    namespace = (svc.get("metadata") or {}).get("namespace")
    selected = [p for p in pods if p.namespace == namespace and
                selector_matches({"matchLabels": selector}, template_labels(p.owner))]
    if not any(p.of_kind("ferrovol") for p in selected):
        f.add("metrics-service", where,
              f"selector {selector} matches no pod that runs ferrovol: nothing would be scraped")
    for p in pods:
        if p.of_kind("ferrovol") and p.kind != "Pod" and p not in selected:
            f.add("metrics-service", p.where,
                  f"runs ferrovol but {where} (selector {selector}) does not select it: its "
                  "metrics would never be scraped")
    for p in selected:
        if not p.of_kind("ferrovol"):
            f.add("metrics-service", p.where, f"selected by {where} but runs no ferrovol")
    ports = spec.get("ports") or []
    if len([sp for sp in ports if sp.get("name") == METRICS_PORT]) != 1:
        f.add("metrics-service", where,
              f"needs one port named {METRICS_PORT!r} (the ServiceMonitor's endpoint port)")
    for sp in ports:
        target = sp.get("targetPort", sp.get("port"))
        for p in selected:
            fv = p.ferrovol()
            if fv is None:
                continue
            declared = fv.raw.get("ports") or []
            key = "name" if isinstance(target, str) else "containerPort"
            found = [cp for cp in declared if cp.get(key) == target]
            if len(found) != 1:
                f.add("metrics-service", fv.where,
                      f"{where} port {sp.get('name')!r} targets {target!r}, which this "
                      "container does not declare (declared: "
                      f"{[(cp.get('name'), cp.get('containerPort')) for cp in declared]})")
                continue
            address = fv.flags.get("metrics-address")
            listening = listen_port(address) if isinstance(address, str) else None
            if listening != found[0].get("containerPort"):
                f.add("metrics-service", fv.where,
                      f"{where} port {sp.get('name')!r} reaches containerPort "
                      f"{found[0].get('containerPort')}, but --metrics-address={address} "
                      f"listens on {listening}")
            if found[0].get("protocol", "TCP") != sp.get("protocol", "TCP"):
                f.add("metrics-service", fv.where,
                      f"{where} port {sp.get('name')!r} and the container port differ in "
                      "protocol")


def guarded(f, check, *args):
    """Runs one check; a crash is reported as a finding of its own, never as a pass."""
    try:
        return check(*args)
    except Exception as e:  # noqa: BLE001 - any crash must show up as a failure
        f.add("internal", check.__name__, f"the check crashed: {e!r}")
        return None


def check_deployment(objs, versions):
    f = Findings()
    guarded(f, check_schemas, objs, f, versions)
    pods = pods_of(objs)
    guarded(f, check_namespaces, objs, f)
    driver = guarded(f, check_driver_names, objs, pods, f)
    for check in (check_storage_classes,):
        guarded(f, check, objs, f)
    for check in (check_images, check_resources, check_privileges, check_ferrovol_flags,
                  check_sidecar_flags, check_sockets, check_host_paths, check_node_ids,
                  check_liveness_and_ports):
        guarded(f, check, pods, f)
    guarded(f, check_registrar, pods, driver, f)
    guarded(f, check_layout, objs, pods, driver, f)
    guarded(f, check_rbac, objs, pods, f)
    guarded(f, check_metrics_service, objs, pods, f)
    return f


# --------------------------------------------------------------------------------------------
# Examples

ACCESS_MODES = {"ReadWriteOnce", "ReadWriteOncePod"}


def storage_of(pvc):
    return quantity(((pvc.get("spec") or {}).get("resources") or {}).get("requests", {})
                    .get("storage"))


def check_examples(examples, base_objs, versions, readme_text):
    """examples: [(file, object)]; base_objs: the rendered base (classes to refer to)."""
    f = Findings()
    objs = [o for _, o in examples]
    check_schemas(objs, f, versions)
    classes = {o["metadata"]["name"]: o for o in one(base_objs, "StorageClass")}
    snapclasses = {o["metadata"]["name"] for o in one(base_objs, "VolumeSnapshotClass")}

    patches = [(n, o) for n, o in examples if n.endswith(".patch.yaml")]
    full = [(n, o) for n, o in examples if not n.endswith(".patch.yaml")]
    pvcs = {o["metadata"]["name"]: o for _, o in full if o.get("kind") == "PersistentVolumeClaim"}
    snaps = {o["metadata"]["name"]: o for _, o in full if o.get("kind") == "VolumeSnapshot"}
    size = {name: storage_of(pvc) for name, pvc in pvcs.items()}

    for name, patch in patches:
        target = pvcs.get((patch.get("metadata") or {}).get("name"))
        where = f"{name} ({ref(patch)})"
        if patch.get("kind") != "PersistentVolumeClaim" or target is None:
            f.add("examples-refs", where, "the expansion patch must target an example PVC")
            continue
        grown = storage_of(patch)
        if grown is None or size[target["metadata"]["name"]] is None or \
                grown <= size[target["metadata"]["name"]]:
            f.add("examples-refs", where, "the expansion patch must request more storage")
        else:
            size[target["metadata"]["name"]] = grown
        sc = classes.get((target.get("spec") or {}).get("storageClassName"))
        if sc is not None and sc.get("allowVolumeExpansion") is not True:
            f.add("examples-refs", where, "its class does not allow expansion")

    for name, pvc in pvcs.items():
        spec = pvc.get("spec") or {}
        where = ref(pvc)
        if spec.get("storageClassName") not in classes:
            f.add("examples-refs", where,
                  f"storageClassName {spec.get('storageClassName')!r} is not a ferrovol class")
        bad_modes = set(spec.get("accessModes") or []) - ACCESS_MODES
        if bad_modes or not spec.get("accessModes"):
            f.add("examples-refs", where, f"access modes must be among {sorted(ACCESS_MODES)}")
        source = spec.get("dataSource")
        if source:
            if source.get("kind") == "VolumeSnapshot":
                snap = snaps.get(source.get("name"))
                if source.get("apiGroup") != "snapshot.storage.k8s.io" or snap is None:
                    f.add("examples-refs", where, f"dataSource {source} is not an example snapshot")
                    continue
                origin = snap["spec"]["source"].get("persistentVolumeClaimName")
            elif source.get("kind") == "PersistentVolumeClaim" and not source.get("apiGroup"):
                origin = source.get("name")
            else:
                f.add("examples-refs", where, f"dataSource {source} is neither a snapshot nor a PVC")
                continue
            if origin not in pvcs:
                f.add("examples-refs", where, f"its data comes from PVC {origin!r}, not an example")
            elif (storage_of(pvc) or 0) < (size[origin] or 0):
                f.add("examples-refs", where,
                      f"smaller than its source {origin} ({size[origin]:.0f} bytes after expansion)")
    for name, snap in snaps.items():
        spec = snap.get("spec") or {}
        if spec.get("volumeSnapshotClassName") not in snapclasses:
            f.add("examples-refs", ref(snap), "volumeSnapshotClassName is not the ferrovol class")
        if (spec.get("source") or {}).get("persistentVolumeClaimName") not in pvcs:
            f.add("examples-refs", ref(snap), "its source is not an example PVC")

    pods = pods_of([o for _, o in full])
    check_images(pods, f)
    check_resources(pods, f)
    used = set()
    for p in pods:
        for c in p.containers:
            for m in c.raw.get("volumeMounts") or []:
                used.add((p.name, m.get("name"), "Filesystem"))
            for d in c.raw.get("volumeDevices") or []:
                used.add((p.name, d.get("name"), "Block"))
        for vname, vol in p.volumes.items():
            claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
            if claim is None:
                continue
            pvc = pvcs.get(claim)
            if pvc is None:
                f.add("examples-refs", p.where, f"volume {vname} uses PVC {claim!r}, not an example")
                continue
            mode = (pvc.get("spec") or {}).get("volumeMode", "Filesystem")
            if (p.name, vname, mode) not in used:
                how = "volumeDevices" if mode == "Block" else "volumeMounts"
                f.add("examples-refs", p.where, f"{mode} volume {vname} must be used through {how}")

    # Every step of the lifecycle is shown.
    consumed = {(pvc.get("spec") or {}).get("volumeMode", "Filesystem") for pvc in pvcs.values()
                if any((v.get("persistentVolumeClaim") or {}).get("claimName") ==
                       pvc["metadata"]["name"] for p in pods for v in p.volumes.values())}
    wanted = {
        "a Filesystem PVC used by a pod": "Filesystem" in consumed,
        "a Block PVC used through volumeDevices": "Block" in consumed,
        "an expansion patch": bool(patches),
        "a VolumeSnapshot": bool(snaps),
        "a PVC restored from a snapshot": any(((p.get("spec") or {}).get("dataSource") or {})
                                              .get("kind") == "VolumeSnapshot"
                                              for p in pvcs.values()),
        "a PVC cloned from a PVC": any(((p.get("spec") or {}).get("dataSource") or {})
                                       .get("kind") == "PersistentVolumeClaim"
                                       for p in pvcs.values()),
    }
    for what, present in wanted.items():
        if not present:
            f.add("examples-coverage", "examples", f"missing {what}")
    if readme_text is not None:
        for name in sorted({n for n, _ in examples}):
            if name not in readme_text:
                f.add("examples-readme", "examples/README.md", f"does not mention {name}")
    return f


# --------------------------------------------------------------------------------------------
# Monitoring: the ServiceMonitor and the Grafana dashboard of deploy/kubernetes/monitoring

MONITORING_DIR = REPO / "deploy" / "kubernetes" / "monitoring"
DASHBOARD_FILE = "grafana-dashboard.json"
METRICS_SOURCE = REPO / "src" / "metrics.rs"

# Labels the Prometheus operator puts on every target of a ServiceMonitor; a relabeling of
# the ServiceMonitor may add more (ferrovol's adds `node` and `component`).
OPERATOR_TARGET_LABELS = frozenset({"instance", "job", "namespace", "service", "pod",
                                    "container", "endpoint"})
# Series Prometheus records itself for every target; they carry the target labels only.
SCRAPE_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped",
                           "scrape_samples_post_metric_relabeling", "scrape_series_added"})
# Discovery labels a target relabeling can read for a ServiceMonitor (roles endpoints and
# endpointslice, with the pod and service of each endpoint), after Prometheus'
# kubernetes_sd_config documentation. The *_label_<name> ones are checked against the labels
# the objects really have.
META_LABELS = frozenset({
    "__address__", "__scheme__", "__metrics_path__", "__scrape_interval__",
    "__scrape_timeout__", "job", "instance",
    "__meta_kubernetes_namespace",
    "__meta_kubernetes_endpoints_name", "__meta_kubernetes_endpoint_hostname",
    "__meta_kubernetes_endpoint_node_name", "__meta_kubernetes_endpoint_ready",
    "__meta_kubernetes_endpoint_port_name", "__meta_kubernetes_endpoint_port_protocol",
    "__meta_kubernetes_endpoint_address_target_kind",
    "__meta_kubernetes_endpoint_address_target_name",
    "__meta_kubernetes_endpointslice_name",
    "__meta_kubernetes_endpointslice_endpoint_hostname",
    "__meta_kubernetes_endpointslice_endpoint_node_name",
    "__meta_kubernetes_endpointslice_port_name",
    "__meta_kubernetes_endpointslice_port_protocol",
    "__meta_kubernetes_pod_name", "__meta_kubernetes_pod_ip",
    "__meta_kubernetes_pod_container_name", "__meta_kubernetes_pod_container_id",
    "__meta_kubernetes_pod_container_image", "__meta_kubernetes_pod_container_port_name",
    "__meta_kubernetes_pod_container_port_number",
    "__meta_kubernetes_pod_container_port_protocol", "__meta_kubernetes_pod_container_init",
    "__meta_kubernetes_pod_ready", "__meta_kubernetes_pod_phase",
    "__meta_kubernetes_pod_node_name", "__meta_kubernetes_pod_host_ip",
    "__meta_kubernetes_pod_uid", "__meta_kubernetes_pod_controller_kind",
    "__meta_kubernetes_pod_controller_name",
    "__meta_kubernetes_service_name", "__meta_kubernetes_service_cluster_ip",
    "__meta_kubernetes_service_port_name", "__meta_kubernetes_service_port_number",
    "__meta_kubernetes_service_port_protocol", "__meta_kubernetes_service_type",
})
GRAFANA_BUILTINS = frozenset({"__rate_interval", "__interval", "__interval_ms", "__range",
                              "__range_s", "__range_ms"})

_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
                                          r"(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_ANY_OBJECT = {"type": "object"}  # fields ferrovol leaves alone (credentials, TLS, proxies)
_RELABEL_ACTIONS = [a for pair in (("replace", "Replace"), ("keep", "Keep"), ("drop", "Drop"),
                                   ("hashmod", "HashMod"), ("labelmap", "LabelMap"),
                                   ("labeldrop", "LabelDrop"), ("labelkeep", "LabelKeep"),
                                   ("lowercase", "Lowercase"), ("uppercase", "Uppercase"),
                                   ("keepequal", "KeepEqual"), ("dropequal", "DropEqual"))
                    for a in pair]
_RELABELINGS = {"type": "array", "items": {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "action": {"enum": _RELABEL_ACTIONS},
        "modulus": {"type": "integer"},
        "regex": {"type": "string"},
        "replacement": {"type": "string"},
        "separator": {"type": "string"},
        "sourceLabels": {"type": "array",
                         "items": {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}},
        "targetLabel": {"type": "string"},
    },
}}
_SCRAPE_PROTOCOLS = ["PrometheusProto", "OpenMetricsText0.0.1", "OpenMetricsText1.0.0",
                     "PrometheusText0.0.4", "PrometheusText1.0.0"]

# Written from the monitoring.coreos.com/v1 ServiceMonitor CRD of the Prometheus operator
# (v0.84): every field of spec and of an endpoint, with the types and patterns of the ones a
# manifest here sets; unknown fields are rejected as the API server's structural schema would.
CRD_SCHEMAS[("monitoring.coreos.com/v1", "ServiceMonitor")] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["endpoints", "selector"],
            "additionalProperties": False,
            "properties": {
                "attachMetadata": {"type": "object", "additionalProperties": False,
                                   "properties": {"node": {"type": "boolean"}}},
                "bodySizeLimit": {"type": "string"},
                "convertClassicHistogramsToNHCB": {"type": "boolean"},
                "endpoints": {"type": "array", "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "authorization": _ANY_OBJECT,
                        "basicAuth": _ANY_OBJECT,
                        "bearerTokenFile": {"type": "string"},
                        "bearerTokenSecret": _ANY_OBJECT,
                        "enableHttp2": {"type": "boolean"},
                        "filterRunning": {"type": "boolean"},
                        "followRedirects": {"type": "boolean"},
                        "honorLabels": {"type": "boolean"},
                        "honorTimestamps": {"type": "boolean"},
                        "interval": _DURATION,
                        "metricRelabelings": _RELABELINGS,
                        "noProxy": {"type": "string"},
                        "oauth2": _ANY_OBJECT,
                        "params": {"type": "object", "additionalProperties": _STRINGS},
                        "path": {"type": "string"},
                        "port": {"type": "string"},
                        "proxyConnectHeader": _ANY_OBJECT,
                        "proxyFromEnvironment": {"type": "boolean"},
                        "proxyUrl": {"type": "string", "pattern": r"^(http|https|socks5)://.+$"},
                        "relabelings": _RELABELINGS,
                        "scheme": {"enum": ["http", "https"]},
                        "scrapeTimeout": _DURATION,
                        "targetPort": {"type": ["integer", "string"]},
                        "tlsConfig": _ANY_OBJECT,
                        "trackTimestampsStaleness": {"type": "boolean"},
                    },
                }},
                "fallbackScrapeProtocol": {"enum": _SCRAPE_PROTOCOLS},
                "jobLabel": {"type": "string"},
                "keepDroppedTargets": {"type": "integer"},
                "labelLimit": {"type": "integer"},
                "labelNameLengthLimit": {"type": "integer"},
                "labelValueLengthLimit": {"type": "integer"},
                "namespaceSelector": {"type": "object", "additionalProperties": False,
                                      "properties": {"any": {"type": "boolean"},
                                                     "matchNames": _STRINGS}},
                "nativeHistogramBucketLimit": {"type": "integer"},
                "nativeHistogramMinBucketFactor": {"type": ["integer", "string"]},
                "podTargetLabels": _STRINGS,
                "sampleLimit": {"type": "integer"},
                "scrapeClass": {"type": "string", "minLength": 1},
                "scrapeClassicHistograms": {"type": "boolean"},
                "scrapeProtocols": {"type": "array", "items": {"enum": _SCRAPE_PROTOCOLS}},
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {"type": "object",
                                        "additionalProperties": {"type": "string"}},
                        "matchExpressions": {"type": "array", "items": {
                            "type": "object",
                            "required": ["key", "operator"],
                            "additionalProperties": False,
                            "properties": {
                                "key": {"type": "string"},
                                "operator": {"enum": ["In", "NotIn", "Exists",
                                                      "DoesNotExist"]},
                                "values": _STRINGS,
                            },
                        }},
                    },
                },
                "selectorMechanism": {"enum": ["RelabelConfig", "RoleSelector"]},
                "targetLabels": _STRINGS,
                "targetLimit": {"type": "integer"},
            },
        },
    },
}


def driver_metrics(source):
    """{metric: (type, labels)} from the table in src/metrics.rs's module doc, whose lines read
    //! | `ferrovol_rpc_requests_total` | counter | `method`, `code` |"""
    out = {}
    for line in source.splitlines():
        m = re.match(r"^//!\s*\|\s*`(ferrovol_[a-z0-9_]+)`\s*\|\s*([a-z]+)\s*\|(.*)\|\s*$", line)
        if m:
            labels = frozenset(re.findall(r"`([a-zA-Z_][a-zA-Z0-9_]*)`", m.group(3)))
            out[m.group(1)] = (m.group(2), labels)
    return out


def grpc_codes(source):
    """The code label's values: the names code_name in src/metrics.rs gives gRPC codes."""
    return frozenset(re.findall(r'Code::\w+\s*=>\s*"([A-Z_]+)"', source))


_SUFFIX_LABELS = {"histogram": {"_bucket": {"le"}, "_sum": set(), "_count": set()},
                  "summary": {"_sum": set(), "_count": set()}}


def series_of(name, metrics):
    """(metric, its type, labels of this series) for a series name the driver exposes, with a
    histogram's _bucket/_sum/_count mapped to the histogram; None when it exposes no such."""
    if name in metrics:
        kind, labels = metrics[name]
        return name, kind, set(labels) | ({"quantile"} if kind == "summary" else set())
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[:-len(suffix)]
        if name.endswith(suffix) and base in metrics:
            kind, labels = metrics[base]
            extra = _SUFFIX_LABELS.get(kind, {}).get(suffix)
            if extra is not None:
                return base, kind, set(labels) | extra
    return None


def sanitized(label):
    """A Kubernetes label as Prometheus names it in __meta_kubernetes_*_label_<name>."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def duration_seconds(text):
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?", str(text or ""))
    if not m or not text:
        return None
    h, mi, s, ms = (int(g or 0) for g in m.groups())
    return h * 3600 + mi * 60 + s + ms / 1000


def check_servicemonitors(objs, service, pod_labels, f):
    """The ServiceMonitors reach the metrics Service (namespace, selector, port, path) and their
    relabelings read discovery labels that exist. Returns (target labels, job names)."""
    target_labels, jobs = set(OPERATOR_TARGET_LABELS), set()
    monitors = one(objs, "ServiceMonitor")
    if not monitors:
        f.add("servicemonitor", "monitoring", "no ServiceMonitor")
    if service is None:
        f.add("servicemonitor", "monitoring",
              "the base renders no metrics Service (app.kubernetes.io/component: metrics)")
        return target_labels, jobs
    smeta = service.get("metadata") or {}
    sname, snamespace = smeta.get("name"), smeta.get("namespace")
    slabels = smeta.get("labels") or {}
    sports = {p.get("name") for p in (service.get("spec") or {}).get("ports") or []}
    for o in objs:
        if o.get("kind") not in CLUSTER_SCOPED and \
                (o.get("metadata") or {}).get("namespace") != snamespace:
            f.add("namespace", ref(o), f"must name namespace {snamespace!r}: no namespace "
                                       "transformer is used (see the base kustomization)")
    for sm in monitors:
        where = ref(sm)
        spec = sm.get("spec") or {}
        own_ns = (sm.get("metadata") or {}).get("namespace")
        nsel = spec.get("namespaceSelector") or {}
        if nsel.get("any") is True:
            pass
        elif "matchNames" in nsel:
            if snamespace not in (nsel.get("matchNames") or []):
                f.add("servicemonitor", where, f"namespaceSelector.matchNames "
                                               f"{nsel.get('matchNames')} leaves out "
                                               f"{snamespace!r}, where Service {sname} is")
        elif own_ns != snamespace:
            f.add("servicemonitor", where, f"without a namespaceSelector it looks in its own "
                                           f"namespace {own_ns!r}, not {snamespace!r}")
        selector = spec.get("selector") or {}
        if not selector_matches(selector, slabels):
            f.add("servicemonitor", where, f"selector {selector} does not match the labels "
                                           f"{slabels} of Service {snamespace}/{sname}")
        job_label = spec.get("jobLabel")
        jobs.add(slabels.get(job_label, sname) if job_label else sname)
        for label in spec.get("targetLabels") or []:
            target_labels.add(sanitized(label))
        for label in spec.get("podTargetLabels") or []:
            target_labels.add(sanitized(label))
            if any(label not in labels for labels in pod_labels):
                f.add("servicemonitor", where, f"podTargetLabels: {label!r} is not on every "
                                               "ferrovol pod")
        endpoints = spec.get("endpoints") or []
        if not endpoints:
            f.add("servicemonitor", where, "no endpoints")
        for i, ep in enumerate(endpoints):
            at = f"{where} endpoints[{i}]"
            if ep.get("port") not in sports:
                f.add("servicemonitor", at, f"port {ep.get('port')!r} is not a port of Service "
                                            f"{sname} (it has {sorted(sports)})")
            if ep.get("path", "/metrics") != "/metrics":
                f.add("servicemonitor", at, f"path {ep.get('path')!r}: the driver serves "
                                            "/metrics")
            if ep.get("scheme", "http") != "http":
                f.add("servicemonitor", at, "the driver serves plain http")
            interval = duration_seconds(ep.get("interval"))
            if interval is None or not 5 <= interval <= 300:
                f.add("servicemonitor", at, f"interval {ep.get('interval')!r}: set one between "
                                            "5s and 5m (a scrape measures the pool)")
            timeout = duration_seconds(ep.get("scrapeTimeout")) if "scrapeTimeout" in ep \
                else None
            if "scrapeTimeout" in ep and (timeout is None or interval is None or
                                          timeout > interval):
                f.add("servicemonitor", at, f"scrapeTimeout {ep.get('scrapeTimeout')!r} must "
                                            f"not exceed the interval {ep.get('interval')!r}")
            for r in ep.get("relabelings") or []:
                for source in r.get("sourceLabels") or []:
                    problem = meta_label_problem(source, slabels, pod_labels)
                    if problem:
                        f.add("servicemonitor", at, f"relabeling reads {source}: {problem}")
                action = str(r.get("action", "replace")).lower()
                target = r.get("targetLabel")
                if action in ("replace", "hashmod", "lowercase", "uppercase") and not target:
                    f.add("servicemonitor", at, f"a {action} relabeling needs a targetLabel")
                if target and not target.startswith("__") and \
                        re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", target):
                    target_labels.add(target)
    return target_labels, jobs


def meta_label_problem(source, service_labels, pod_labels):
    """Why a relabeling's source label would be empty for ferrovol's targets, or None."""
    pods, service = "every ferrovol pod", "the metrics Service"
    for prefix, labels, what in (("__meta_kubernetes_pod_label_", None, pods),
                                 ("__meta_kubernetes_pod_labelpresent_", None, pods),
                                 ("__meta_kubernetes_service_label_", service_labels, service),
                                 ("__meta_kubernetes_service_labelpresent_", service_labels,
                                  service)):
        if source.startswith(prefix):
            name = source[len(prefix):]
            sets = [set(map(sanitized, ls)) for ls in (pod_labels if labels is None
                                                       else [labels])]
            if not sets or any(name not in s for s in sets):
                return f"not a label of {what}"
            return None
    for prefix in ("__meta_kubernetes_pod_annotation", "__meta_kubernetes_service_annotation",
                   "__meta_kubernetes_endpoints_label", "__meta_kubernetes_endpointslice_label",
                   "__param_", "__tmp_"):
        if source.startswith(prefix):
            return None
    if source in META_LABELS:
        return None
    return "no such discovery label (a typo leaves the target label empty)"


_PROMQL_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"__S(\d+)__"\s*(?:,|$)')
_SELECTOR = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^{}]*)\}')
_GROUPING = re.compile(r'\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)')
_DRIVER_SERIES = re.compile(r"\bferrovol_[a-z_]+")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::[a-z]+)?\}|\$([A-Za-z_][A-Za-z0-9_]*)"
                       r"|\[\[([A-Za-z_][A-Za-z0-9_]*)\]\]")
_LEGEND = re.compile(r"\{\{\s*([^}]*?)\s*\}\}")
PROMQL_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right",
                             "offset", "bool", "and", "or", "unless", "atan2"})


def mask_strings(expr):
    """The expression with each string literal replaced by "__S<i>__", and the strings."""
    strings = []

    def keep(m):
        strings.append(m.group(0)[1:-1])
        return f'"__S{len(strings) - 1}__"'

    return _PROMQL_STRING.sub(keep, expr), strings


def matching_paren(text, start):
    """Index of the parenthesis closing the one at start, or None."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return None


class Promql:
    """What the dashboard checks need from one PromQL expression, read with regular expressions
    after masking its strings: the driver series it reads, its selectors and groupings."""

    def __init__(self, expr):
        self.expr = expr
        text = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::[a-z]+)?\}", r"$\1", expr)
        self.masked, self.strings = mask_strings(text)
        self.series = _DRIVER_SERIES.findall(self.masked)
        self.selectors = []  # (metric or None, [(label, op, value)], leftover text)
        for m in _SELECTOR.finditer(self.masked):
            body, matchers, pos = m.group(2), [], 0
            while pos < len(body):
                mm = _MATCHER.match(body, pos)
                if not mm or mm.end() == pos:
                    break
                matchers.append((mm.group(1), mm.group(2), self.strings[int(mm.group(3))]))
                pos = mm.end()
            metric = m.group(1) if m.group(1) not in PROMQL_KEYWORDS else None
            self.selectors.append((metric, matchers, body[pos:].strip()))
        # A series named without braces selects with no matchers at all.
        bare = "|".join(["ferrovol_[a-z_]+"] + sorted(SCRAPE_SERIES))
        for m in re.finditer(rf"(?<![\w:])({bare})(?![\w:])(?!\s*[{{(])", self.masked):
            self.selectors.append((m.group(1), [], ""))
        self.groupings = [(m.group(1), [x.strip() for x in m.group(2).split(",") if x.strip()])
                          for m in _GROUPING.finditer(self.masked)]

    def syntax_problems(self):
        problems = []
        if re.search(r"[\"'`]", _PROMQL_STRING.sub("", self.masked)):
            problems.append("an unterminated string")
        pairs = {")": "(", "]": "[", "}": "{"}
        stack = []
        for ch in self.masked:
            if ch in "([{":
                stack.append(ch)
            elif ch in pairs:
                if not stack or stack.pop() != pairs[ch]:
                    return problems + [f"an unmatched {ch!r}"]
        if stack:
            problems.append(f"an unclosed {stack[-1]!r}")
        for metric, _, leftover in self.selectors:
            if leftover:
                problems.append(f"a selector {metric or ''}{{...}} that does not read as "
                                f"label=\"value\" matchers ({leftover!r})")
        return problems

    def quantile_calls(self):
        """The text inside each histogram_quantile(...)."""
        out = []
        for m in re.finditer(r"\bhistogram_quantile\s*\(", self.masked):
            end = matching_paren(self.masked, m.end() - 1)
            out.append(self.masked[m.end():end] if end else self.masked[m.end():])
        return out


def check_expr(expr, where, metrics, codes, target_labels, jobs, f):
    """One PromQL expression against the driver's metrics table. Returns the labels its result
    can carry (for legends)."""
    q = Promql(expr)
    for problem in q.syntax_problems():
        f.add("dashboard", where, f"{expr!r} has {problem}")
    known = {}
    for name in q.series:
        found = series_of(name, metrics)
        if found is None:
            f.add("dashboard-metrics", where,
                  f"{name} is not a metric of the driver (src/metrics.rs has "
                  f"{', '.join(sorted(metrics)) or 'none'})")
        else:
            known[name] = found
    any_labels = set(target_labels)
    for _, _, labels in known.values():
        any_labels |= labels
    for metric, matchers, _ in q.selectors:
        if metric is None:
            allowed, what = any_labels | {"__name__"}, "this expression's series"
        elif metric in known:
            allowed, what = known[metric][2] | target_labels, metric
        elif metric in SCRAPE_SERIES:
            allowed, what = set(target_labels), metric
        elif metric.startswith("ferrovol_"):
            continue  # reported above
        else:
            f.add("dashboard-metrics", where, f"{metric} is neither a driver metric nor a "
                                              "series Prometheus records for its targets")
            continue
        for label, op, value in matchers:
            if label not in allowed:
                f.add("dashboard-labels", where,
                      f"{what} has no label {label!r} (it has {', '.join(sorted(allowed))})")
            if label == "code" and op in ("=", "!=") and value not in codes:
                f.add("dashboard-labels", where,
                      f"code {op} {value!r}: codes are gRPC names ({', '.join(sorted(codes))})")
            if label == "code" and op in ("=~", "!~"):
                for alt in value.split("|"):
                    if re.fullmatch(r"[A-Za-z_]+", alt) and alt not in codes:
                        f.add("dashboard-labels", where, f"code {op} {value!r}: {alt!r} is not "
                                                         "a gRPC code name")
            if label == "job" and op == "=" and value not in jobs:
                f.add("dashboard-labels", where, f"job={value!r}, but the ServiceMonitor's "
                                                 f"targets have job {sorted(jobs)}")
    result_labels = set()
    for keyword, labels in q.groupings:
        for label in labels:
            if label not in any_labels:
                f.add("dashboard-labels", where,
                      f"{keyword} ({label}): no series of this expression has a label "
                      f"{label!r} (they have {', '.join(sorted(any_labels))})")
        if keyword == "by":
            result_labels |= set(labels)
    # Counters and histogram series only mean something as a rate.
    for name, (base, kind, _) in known.items():
        if name == base and kind == "histogram":
            f.add("dashboard-metrics", where, f"{name} is a histogram: Prometheus stores its "
                                              "_bucket, _sum and _count series, not this name")
            continue
        if kind != "counter" and name == base:
            continue
        total = len(re.findall(rf"\b{name}\b", q.masked))
        wrapped = len(re.findall(rf"\b(?:rate|irate|increase)\s*\(\s*{name}\s*(?:\{{[^{{}}]*\}})?"
                                 rf"\s*\[[^\[\]]+\]\s*\)", q.masked))
        if wrapped < total:
            f.add("dashboard-metrics", where, f"{name} is a {kind} series: use it inside "
                                              "rate(...[range]) or increase(...[range])")
    for inner in q.quantile_calls():
        if not re.search(r"\bferrovol_[a-z_]+_bucket\b", inner):
            f.add("dashboard-metrics", where, "histogram_quantile over no _bucket series")
        for keyword, labels in _GROUPING.findall(inner):
            labels = {x.strip() for x in labels.split(",")}
            if (keyword == "by" and "le" not in labels) or (keyword == "without" and
                                                           "le" in labels):
                f.add("dashboard-metrics", where,
                      f"histogram_quantile needs the le label: {keyword} ({', '.join(labels)}) "
                      "drops it")
    return result_labels or any_labels


def panels_of(dashboard):
    """Every panel, rows' collapsed panels included."""
    out = []
    for p in dashboard.get("panels") or []:
        out.append(p)
        out.extend(p.get("panels") or [])
    return out


def check_dashboard(text, metrics, codes, target_labels, jobs, f):
    """The Grafana dashboard: valid JSON, every panel queries the Prometheus data source variable,
    and every expression uses metrics and labels the driver and the ServiceMonitor provide."""
    where = DASHBOARD_FILE
    try:
        dashboard = json.loads(text)
    except ValueError as e:
        f.add("dashboard", where, f"not valid JSON: {e}")
        return
    if not isinstance(dashboard, dict):
        f.add("dashboard", where, "not a JSON object")
        return
    if not metrics:
        f.add("dashboard-metrics", str(METRICS_SOURCE),
              "no metrics table in the module doc (lines like //! | `ferrovol_...` | type | "
              "labels |)")
    for key, kind in (("title", str), ("uid", str), ("schemaVersion", int), ("panels", list)):
        if not isinstance(dashboard.get(key), kind) or not dashboard.get(key):
            f.add("dashboard", where, f"needs {key}")
    if isinstance(dashboard.get("schemaVersion"), int) and dashboard["schemaVersion"] < 36:
        f.add("dashboard", where, "schemaVersion below 36: Grafana 9 or newer")
    if dashboard.get("id") is not None:
        f.add("dashboard", where, "id must be null, so that an import creates the dashboard")
    variables = {v.get("name"): v for v in (dashboard.get("templating") or {}).get("list") or []}
    sources = [n for n, v in variables.items()
               if v.get("type") == "datasource" and v.get("query") == "prometheus"]
    if not sources:
        f.add("dashboard", where, "no data source variable of type prometheus")
    source_refs = {f"${{{n}}}" for n in sources} | {f"${n}" for n in sources}

    def datasource_ok(ds):
        return isinstance(ds, dict) and ds.get("type") == "prometheus" and \
            ds.get("uid") in source_refs

    filters = {}  # label -> variable, for query variables over a label
    for name, var in variables.items():
        if var.get("type") != "query":
            continue
        at = f"{where} variable {name}"
        if not datasource_ok(var.get("datasource")):
            f.add("dashboard", at, f"datasource must be the data source variable "
                                   f"{sorted(source_refs)}")
        query = var.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        m = re.fullmatch(r"\s*label_values\(\s*(?:(.*?)\s*,\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*",
                         str(query or ""))
        if not m:
            f.add("dashboard", at, f"query {query!r} is not label_values(series, label)")
            continue
        label = m.group(2)
        if m.group(1):
            q = Promql(m.group(1))
            check_expr(m.group(1), at, metrics, codes, target_labels, jobs, f)
            labels = set(target_labels)
            for s in q.series:
                found = series_of(s, metrics)
                labels |= found[2] if found else set()
        else:
            labels = set(target_labels)
        if label not in labels:
            f.add("dashboard-labels", at, f"label_values(..., {label}): the series have no label "
                                          f"{label!r} (they have {', '.join(sorted(labels))})")
        filters[label] = name
    if "node" not in filters:
        f.add("dashboard", where, "no query variable over the node label")

    panels = panels_of(dashboard)
    ids = [p.get("id") for p in panels]
    for dup in sorted({i for i in ids if ids.count(i) > 1}, key=str):
        f.add("dashboard", where, f"panel id {dup} is used twice")
    for p in panels:
        at = f"{where} panel {p.get('id')} {p.get('title')!r}"
        if p.get("type") == "row":
            continue
        if not p.get("title") or not p.get("type"):
            f.add("dashboard", at, "needs a type and a title")
        grid = p.get("gridPos") or {}
        if not all(isinstance(grid.get(k), int) for k in "hwxy") or \
                grid.get("x", 0) + grid.get("w", 0) > 24:
            f.add("dashboard", at, "gridPos needs integers h, w, x, y within 24 columns")
        if not datasource_ok(p.get("datasource")):
            f.add("dashboard", at, f"datasource must be the data source variable "
                                   f"{sorted(source_refs)}, so that any Prometheus can be chosen")
        targets = p.get("targets") or []
        if not targets:
            f.add("dashboard", at, "has no targets")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or not all(refs):
            f.add("dashboard", at, "every target needs its own refId")
        for t in targets:
            tat = f"{at} target {t.get('refId')}"
            expr = t.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                f.add("dashboard", tat, "has no expr")
                continue
            if "datasource" in t and not datasource_ok(t["datasource"]):
                f.add("dashboard", tat, "datasource must be the data source variable")
            for m in _VARIABLE.finditer(expr):
                name = m.group(1) or m.group(2) or m.group(3)
                if name not in variables and name not in GRAFANA_BUILTINS:
                    f.add("dashboard", tat, f"${name} is not a variable of the dashboard")
            result = check_expr(expr, tat, metrics, codes, target_labels, jobs, f)
            for label in _LEGEND.findall(t.get("legendFormat") or ""):
                if label not in result:
                    f.add("dashboard-labels", tat,
                          f"legend {{{{{label}}}}}: the result has no label {label!r} (it has "
                          f"{', '.join(sorted(result))})")
            # Every variable over a label filters every series that has the label.
            q = Promql(expr)
            for metric, matchers, _ in q.selectors:
                if metric is None or not (metric in SCRAPE_SERIES or
                                          series_of(metric, metrics)):
                    continue
                for label, var in filters.items():
                    if not any(lbl == label and op == "=~" and val in (f"${var}", f"${{{var}}}")
                               for lbl, op, val in matchers):
                        f.add("dashboard", tat, f"{metric} is not filtered by "
                                                f"{label}=~\"${var}\": the {var} menu would not "
                                                "apply to it")


def monitoring_inputs(kubectl, directory, overlays=None):
    """(rendered monitoring objects, rendered base, [rendered overlay], dashboard text or None,
    metrics source text)."""
    objs = render(kubectl, directory)
    base = render(kubectl, REPO / "deploy" / "kubernetes" / "base")
    if overlays is None:
        overlays = [render(kubectl, overlay_dir(name)) for name in (S, M)]
    dashboard = None
    for candidate in (Path(directory) / DASHBOARD_FILE, MONITORING_DIR / DASHBOARD_FILE):
        if candidate.exists():
            dashboard = candidate.read_text()
            break
    source = METRICS_SOURCE.read_text() if METRICS_SOURCE.exists() else ""
    return objs, base, overlays, dashboard, source


def check_monitoring(objs, base, overlays, dashboard, source, versions):
    f = Findings()
    guarded(f, check_schemas, objs, f, versions)
    services = metrics_services(base)
    service = services[0] if len(services) == 1 else None
    pod_labels = [template_labels(p.owner) for o in overlays for p in pods_of(o)
                  if p.of_kind("ferrovol")]
    result = guarded(f, check_servicemonitors, objs, service, pod_labels, f)
    target_labels, jobs = result if result else (set(OPERATOR_TARGET_LABELS), set())
    if dashboard is None:
        f.add("dashboard", "monitoring", f"no {DASHBOARD_FILE}")
    else:
        guarded(f, check_dashboard, dashboard, driver_metrics(source), grpc_codes(source),
                target_labels, jobs, f)
    return f


# --------------------------------------------------------------------------------------------
# Mutations: each breaks a correct rendering in one way; the named check must catch it.


def objects(objs, kind, name=None):
    return [o for o in objs if o.get("kind") == kind and
            (name is None or o["metadata"]["name"] == name)]


def containers(objs, kind):
    """Raw container dicts of the given sidecar kind in every workload."""
    out = []
    for o in objs:
        if o.get("kind") in WORKLOAD_KINDS:
            tmpl = o["spec"] if o["kind"] == "Pod" else o["spec"]["template"]["spec"]
            for c in tmpl.get("containers") or []:
                if Container(PodTemplate(o), c).kind == kind:
                    out.append((o, c))
    if not out:
        raise LookupError(f"no {kind} container to mutate")
    return out


def workload(objs, kind):
    found = objects(objs, kind)
    if not found:
        raise LookupError(f"no {kind} to mutate")
    return found[0]


def set_arg(c, flag, value):
    """Replaces --flag[=...] (or adds it); value None removes it."""
    args = [a for a in c.get("args", []) if a.split("=", 1)[0] != f"--{flag}"]
    if value is not None:
        args.append(f"--{flag}" if value is True else f"--{flag}={value}")
    c["args"] = args


def in_ferrovol(objs, kind, fn):
    for _, c in containers([workload(objs, kind)], "ferrovol"):
        fn(c)


def drop_rule(role_name, resource, verb):
    def mutate(objs):
        role = (objects(objs, "ClusterRole", role_name) + objects(objs, "Role", role_name))[0]
        for rule in role["rules"]:
            if resource in rule["resources"] and verb in rule["verbs"]:
                rule["verbs"].remove(verb)
                return
        raise LookupError(f"{role_name} has no {resource} {verb}")
    return mutate


def remove(kind, name):
    def mutate(objs):
        victims = objects(objs, kind, name)
        if not victims:
            raise LookupError(f"no {kind} {name}")
        for v in victims:
            objs.remove(v)
    return mutate


def each_container(kind, fn):
    def mutate(objs):
        for _, c in containers(objs, kind):
            fn(c)
    return mutate


def mount_of(c, volume):
    for m in c["volumeMounts"]:
        if m["name"] == volume:
            return m
    raise LookupError(f"{c['name']} does not mount {volume}")


def volume_of(objs, kind, name):
    for v in workload(objs, kind)["spec"]["template"]["spec"]["volumes"]:
        if v["name"] == name:
            return v
    raise LookupError(f"no volume {name}")


def csidriver_spec(objs):
    return objects(objs, "CSIDriver")[0]["spec"]


S, M = "single-node", "multi-node"

MUTATIONS = [
    # (name, overlay, mutation, check that must catch it)
    ("StorageClass provisioner renamed", S,
     lambda o: objects(o, "StorageClass")[0].update(provisioner="ferrovol.example.com"),
     "driver-name"),
    ("VolumeSnapshotClass driver typo", S,
     lambda o: objects(o, "VolumeSnapshotClass")[0].update(driver="ferovol.csi.dev"), "driver-name"),
    ("CSIDriver renamed", M,
     lambda o: objects(o, "CSIDriver")[0]["metadata"].update(name="other.csi.dev"), "driver-name"),
    ("ferrovol --driver-name differs", S,
     lambda o: in_ferrovol(o, "StatefulSet", lambda c: set_arg(c, "driver-name", "x.csi.dev")),
     "driver-name"),
    ("provisioner ClusterRole loses PVC update", S,
     drop_rule("ferrovol-external-provisioner", "persistentvolumeclaims", "update"), "rbac"),
    ("attacher ClusterRoleBinding removed", S,
     remove("ClusterRoleBinding", "ferrovol-plugin-attacher"), "rbac"),
    ("provisioner ClusterRole grants an extra verb", S,
     lambda o: objects(o, "ClusterRole", "ferrovol-external-provisioner")[0]["rules"].append(
         {"apiGroups": [""], "resources": ["nodes"], "verbs": ["delete"]}), "rbac"),
    ("ClusterRole merging two sidecars", S,
     lambda o: objects(o, "ClusterRole", "ferrovol-external-resizer")[0]["rules"].extend(
         objects(o, "ClusterRole", "ferrovol-external-attacher")[0]["rules"]), "rbac"),
    ("resizer leader-election lease binding removed", M,
     remove("RoleBinding", "ferrovol-controller-resizer-leader-election"), "rbac"),
    ("capacity Role loses pods get", M,
     drop_rule("ferrovol-external-provisioner-capacity", "pods", "get"), "rbac"),
    ("resizer bound to the node service account too", M,
     lambda o: objects(o, "ClusterRoleBinding", "ferrovol-node-snapshotter")[0]["roleRef"].update(
         name="ferrovol-external-resizer"), "rbac"),
    ("node ServiceAccount removed", M, remove("ServiceAccount", "ferrovol-node"), "rbac"),
    ("binding subject in the wrong namespace", S,
     lambda o: objects(o, "ClusterRoleBinding", "ferrovol-plugin-resizer")[0]["subjects"][0].update(
         namespace="default"), "rbac"),
    ("resizer --csi-address names another socket", S,
     each_container("resizer", lambda c: set_arg(c, "csi-address", "/csi/other.sock")), "socket"),
    ("provisioner mounts the socket dir elsewhere", S,
     each_container("provisioner", lambda c: mount_of(c, "socket-dir").update(mountPath="/plugin")),
     "socket"),
    ("livenessprobe mounts another volume at /csi", M,
     each_container("livenessprobe", lambda c: mount_of(c, "socket-dir").update(name="data-dir")),
     "socket"),
    ("ferrovol serves another socket file", M,
     lambda o: in_ferrovol(o, "DaemonSet", lambda c: set_arg(c, "endpoint", "unix:///csi/x.sock")),
     "socket"),
    ("registration path in another directory", S,
     each_container("registrar", lambda c: set_arg(
         c, "kubelet-registration-path", "/var/lib/kubelet/plugins/ferrovol/csi.sock")),
     "registrar"),
    ("socket hostPath not under the driver's name", M,
     lambda o: volume_of(o, "DaemonSet", "socket-dir")["hostPath"].update(
         path="/var/lib/kubelet/plugins/other"), "registrar"),
    ("registrar removed", M,
     lambda o: workload(o, "DaemonSet")["spec"]["template"]["spec"].update(containers=[
         c for c in workload(o, "DaemonSet")["spec"]["template"]["spec"]["containers"]
         if c["name"] != "node-driver-registrar"]), "registrar"),
    ("typo in a container field", S,
     each_container("attacher", lambda c: c.update(imagePullPolcy="IfNotPresent")), "schema"),
    ("typo in a CSIDriver field", M,
     lambda o: csidriver_spec(o).update(attachRequried=True), "schema"),
    ("wrong type in a probe", S,
     lambda o: in_ferrovol(o, "StatefulSet",
                           lambda c: c["livenessProbe"].update(periodSeconds="ten")), "schema"),
    ("typo in the VolumeSnapshotClass", S,
     lambda o: objects(o, "VolumeSnapshotClass")[0].update(deletionPolcy="Delete"), "crd-schema"),
    ("provisioner privileged", S,
     each_container("provisioner", lambda c: c["securityContext"].update(privileged=True)),
     "privilege"),
    ("Bidirectional propagation on a sidecar", S,
     each_container("attacher", lambda c: mount_of(c, "socket-dir").update(
         mountPropagation="Bidirectional")), "privilege"),
    ("node ferrovol not privileged", M,
     lambda o: in_ferrovol(o, "DaemonSet", lambda c: c["securityContext"].update(privileged=False)),
     "privilege"),
    ("controller ferrovol privileged", M,
     lambda o: in_ferrovol(o, "Deployment", lambda c: c["securityContext"].update(privileged=True)),
     "privilege"),
    ("attacher image :latest", S,
     each_container("attacher", lambda c: c.update(
         image="registry.k8s.io/sig-storage/csi-attacher:latest")), "image"),
    ("ferrovol image without a tag", M,
     lambda o: in_ferrovol(o, "DaemonSet", lambda c: c.update(image="ghcr.io/ferrovol/ferrovol")),
     "image"),
    ("snapshotter without limits", M,
     each_container("snapshotter", lambda c: c["resources"].pop("limits")), "resources"),
    ("ferrovol without a memory request", S,
     lambda o: in_ferrovol(o, "StatefulSet", lambda c: c["resources"]["requests"].pop("memory")),
     "resources"),
    ("node ferrovol grows storage in the controller", M,
     lambda o: in_ferrovol(o, "DaemonSet", lambda c: set_arg(c, "expansion", "controller")),
     "expansion"),
    ("controller ferrovol advertises controller expansion", M,
     lambda o: in_ferrovol(o, "Deployment", lambda c: set_arg(c, "expansion", None)), "expansion"),
    ("controller Deployment runs --mode=all", M,
     lambda o: in_ferrovol(o, "Deployment", lambda c: set_arg(c, "mode", "all")), "expansion"),
    ("attachRequired without an attacher", M,
     lambda o: csidriver_spec(o).update(attachRequired=True), "attach"),
    ("attacher runs but attachRequired false", S,
     lambda o: csidriver_spec(o).update(attachRequired=False), "attach"),
    ("per-node provisioner without --node-deployment", M,
     each_container("provisioner", lambda c: set_arg(c, "node-deployment", None)),
     "node-deployment"),
    ("per-node snapshotter without NODE_NAME", M,
     each_container("snapshotter", lambda c: c.pop("env")), "node-deployment"),
    ("per-node provisioner elects a leader", M,
     each_container("provisioner", lambda c: set_arg(c, "leader-election", True)),
     "leader-election"),
    ("controller resizer without leader election", M,
     each_container("resizer", lambda c: set_arg(c, "leader-election", None)), "leader-election"),
    ("capacity published but not used by the scheduler", M,
     lambda o: csidriver_spec(o).update(storageCapacity=False), "capacity"),
    ("capacity owner level of a Deployment in a DaemonSet", M,
     each_container("provisioner", lambda c: set_arg(c, "capacity-ownerref-level", "2")),
     "capacity"),
    ("livenessprobe sidecar removed", S,
     lambda o: workload(o, "StatefulSet")["spec"]["template"]["spec"].update(containers=[
         c for c in workload(o, "StatefulSet")["spec"]["template"]["spec"]["containers"]
         if c["name"] != "liveness-probe"]), "liveness"),
    ("healthz port is not the probe's port", S,
     each_container("livenessprobe", lambda c: set_arg(c, "health-port", "9899")), "liveness"),
    ("metrics port not declared", M,
     lambda o: in_ferrovol(o, "DaemonSet", lambda c: set_arg(c, "metrics-address", "0.0.0.0:9811")),
     "metrics"),
    ("node id not from the node's name", S,
     lambda o: in_ferrovol(o, "StatefulSet", lambda c: set_arg(c, "node-id", "node-1")), "node-id"),
    ("unknown StorageClass parameter", S,
     lambda o: objects(o, "StorageClass")[0]["parameters"].update(iops="100"), "storageclass"),
    ("StorageClass binds immediately", M,
     lambda o: objects(o, "StorageClass")[1].update(volumeBindingMode="Immediate"), "storageclass"),
    ("typo in a ferrovol flag value", S,
     lambda o: in_ferrovol(o, "StatefulSet", lambda c: set_arg(c, "expansion", "nodes")), "flags"),
    ("unknown ferrovol flag", M,
     lambda o: in_ferrovol(o, "DaemonSet", lambda c: set_arg(c, "pool", "/var/lib/ferrovol/pool")),
     "flags"),
    ("single-node plugin scaled to two", S,
     lambda o: workload(o, "StatefulSet")["spec"].update(replicas=2), "pinning"),
    ("single-node plugin not pinned", S,
     lambda o: workload(o, "StatefulSet")["spec"]["template"]["spec"].pop("nodeSelector"),
     "pinning"),
    ("provisioner without Topology", S,
     each_container("provisioner", lambda c: set_arg(c, "feature-gates", None)), "sidecar-flags"),
    ("state kept inside the container", S,
     lambda o: in_ferrovol(o, "StatefulSet", lambda c: set_arg(c, "state-dir", "/tmp/state")),
     "host-paths"),
    ("controller ferrovol mounts the host's /dev", M,
     lambda o: (workload(o, "Deployment")["spec"]["template"]["spec"]["volumes"].append(
         {"name": "dev", "hostPath": {"path": "/dev"}}),
         in_ferrovol(o, "Deployment", lambda c: c["volumeMounts"].append(
             {"name": "dev", "mountPath": "/dev"}))), "host-paths"),
    ("two sidecars listen on one port", S,
     each_container("registrar", lambda c: set_arg(c, "http-endpoint", ":9808")), "ports"),
    ("namespaced object outside the namespace", M,
     lambda o: objects(o, "ServiceAccount")[0]["metadata"].update(namespace="kube-system"),
     "namespace"),
    ("metrics Service selects no ferrovol pod", S,
     lambda o: metrics_service_spec(o).update(selector={"app.kubernetes.io/name": "ferrovol-csi"}),
     "metrics-service"),
    ("metrics Service leaves out the controller", M,
     lambda o: metrics_service_spec(o)["selector"].update(
         {"app.kubernetes.io/component": "node"}), "metrics-service"),
    ("metrics Service targets a port name the driver lacks", S,
     lambda o: metrics_service_spec(o)["ports"][0].update(targetPort="metric"), "metrics-service"),
    ("metrics Service targets a port number no container declares", M,
     lambda o: metrics_service_spec(o)["ports"][0].update(targetPort=9811), "metrics-service"),
    ("metrics Service port renamed", S,
     lambda o: metrics_service_spec(o)["ports"][0].update(name="http"), "metrics-service"),
    ("metrics Service not headless", S,
     lambda o: metrics_service_spec(o).pop("clusterIP"), "metrics-service"),
    ("metrics Service removed", M, remove("Service", "ferrovol-metrics"), "metrics-service"),
    ("controller ferrovol serves metrics on another port", M,
     lambda o: in_ferrovol(o, "Deployment",
                           lambda c: set_arg(c, "metrics-address", "0.0.0.0:9811")),
     "metrics-service"),
    ("metrics Service without a selector", S,
     lambda o: metrics_service_spec(o).pop("selector"), "metrics-service"),
    ("metrics Service port over UDP", M,
     lambda o: metrics_service_spec(o)["ports"][0].update(protocol="UDP"), "metrics-service"),
    ("metrics Service selects a pod without the driver", M, lambda o: _driverless_copy(o),
     "metrics-service"),
]


def _driverless_copy(objs):
    """A second Deployment with the driver's labels but only csi-resizer in it."""
    extra = copy.deepcopy(workload(objs, "Deployment"))
    extra["metadata"]["name"] = "ferrovol-extra"
    spec = extra["spec"]["template"]["spec"]
    spec["containers"] = [c for c in spec["containers"] if c["name"] != "ferrovol"]
    objs.append(extra)


def metrics_service_spec(objs):
    found = metrics_services(objs)
    if not found:
        raise LookupError("no metrics Service to mutate")
    return found[0]["spec"]


def monitor_of(state):
    found = objects(state["objs"], "ServiceMonitor")
    if not found:
        raise LookupError("no ServiceMonitor to mutate")
    return found[0]


def endpoint_of(state):
    return monitor_of(state)["spec"]["endpoints"][0]


def in_dashboard(fn):
    def mutate(state):
        dashboard = json.loads(state["dashboard"])
        fn(dashboard)
        state["dashboard"] = json.dumps(dashboard)
    return mutate


def panel_titled(dashboard, title):
    for p in panels_of(dashboard):
        if p.get("title") == title:
            return p
    raise LookupError(f"no panel {title!r}")


def edit_expr(title, old, new):
    """Replaces old by new in the expressions of the panel with this title."""
    def fn(dashboard):
        changed = False
        for t in panel_titled(dashboard, title)["targets"]:
            if old in t["expr"]:
                t["expr"] = t["expr"].replace(old, new)
                changed = True
        if not changed:
            raise LookupError(f"panel {title!r} has no {old!r}")
    return in_dashboard(fn)


def edit_source(old, new):
    def mutate(state):
        if old not in state["source"]:
            raise LookupError(f"src/metrics.rs has no {old!r}")
        state["source"] = state["source"].replace(old, new)
    return mutate


def node_variable(dashboard):
    for v in dashboard["templating"]["list"]:
        if v.get("name") == "node":
            return v
    raise LookupError("no node variable")


RATE_PANEL, ERROR_PANEL = "RPC rate by method", "RPC errors by method and code"
LATENCY_PANEL, IN_FLIGHT_PANEL = "RPC latency p50 and p99 by method", "RPCs in flight by method"

MONITORING_MUTATIONS = [
    # (name, mutation of {"objs", "base", "dashboard", "source"}, check that must catch it)
    ("ServiceMonitor endpoint port not in the Service",
     lambda st: endpoint_of(st).update(port="http-metrics"), "servicemonitor"),
    ("ServiceMonitor selector does not match the Service",
     lambda st: monitor_of(st)["spec"]["selector"]["matchLabels"].update(
         {"app.kubernetes.io/component": "node"}), "servicemonitor"),
    ("ServiceMonitor selector expression excludes the Service",
     lambda st: monitor_of(st)["spec"]["selector"].update(matchExpressions=[
         {"key": "app.kubernetes.io/component", "operator": "NotIn", "values": ["metrics"]}]),
     "servicemonitor"),
    ("typo in a ServiceMonitor endpoint field",
     lambda st: endpoint_of(st).update(intreval=endpoint_of(st).pop("interval")), "crd-schema"),
    ("typo in the ServiceMonitor spec",
     lambda st: monitor_of(st)["spec"].update(
         namespaceSelecter=monitor_of(st)["spec"].pop("namespaceSelector")), "crd-schema"),
    ("ServiceMonitor looks in another namespace",
     lambda st: monitor_of(st)["spec"]["namespaceSelector"].update(matchNames=["monitoring"]),
     "servicemonitor"),
    ("ServiceMonitor scrapes another path",
     lambda st: endpoint_of(st).update(path="/metric"), "servicemonitor"),
    ("scrape timeout longer than the interval",
     lambda st: endpoint_of(st).update(scrapeTimeout="1m"), "servicemonitor"),
    ("relabeling reads a discovery label that does not exist",
     lambda st: endpoint_of(st)["relabelings"][0].update(
         sourceLabels=["__meta_kubernetes_pod_nodename"]), "servicemonitor"),
    ("relabeling reads a pod label ferrovol pods lack",
     lambda st: endpoint_of(st)["relabelings"][1].update(
         sourceLabels=["__meta_kubernetes_pod_label_app_kubernetes_io_instance"]),
     "servicemonitor"),
    ("ServiceMonitor removed", lambda st: st.update(objs=[]), "servicemonitor"),
    ("dashboard uses a metric the driver does not have",
     edit_expr(RATE_PANEL, "ferrovol_rpc_requests_total", "ferrovol_rpc_request_total"),
     "dashboard-metrics"),
    ("the driver renames a metric the dashboard uses",
     edit_source("`ferrovol_staged_volumes`", "`ferrovol_volumes_staged`"), "dashboard-metrics"),
    ("dashboard queries a histogram by its bare name",
     edit_expr(LATENCY_PANEL, "ferrovol_rpc_duration_seconds_bucket",
               "ferrovol_rpc_duration_seconds"), "dashboard-metrics"),
    ("counter graphed without rate()",
     edit_expr(RATE_PANEL, 'rate(ferrovol_rpc_requests_total{node=~"$node"}[$__rate_interval])',
               'ferrovol_rpc_requests_total{node=~"$node"}'), "dashboard-metrics"),
    ("quantile aggregated without le",
     edit_expr(LATENCY_PANEL, "by (method, le)", "by (method)"), "dashboard-metrics"),
    ("dashboard groups by a label no metric has",
     edit_expr(RATE_PANEL, "by (method)", "by (volume_id)"), "dashboard-labels"),
    ("dashboard selects a label the metric lacks",
     edit_expr(IN_FLIGHT_PANEL, 'node=~"$node"', 'node=~"$node", code!="OK"'),
     "dashboard-labels"),
    ("error panel compares code with a name gRPC does not use",
     edit_expr(ERROR_PANEL, 'code!="OK"', 'code!="Ok"'), "dashboard-labels"),
    ("legend names a label the result lacks",
     in_dashboard(lambda d: panel_titled(d, RATE_PANEL)["targets"][0].update(
         legendFormat="{{volume}}")), "dashboard-labels"),
    ("node relabeling removed while the panels filter by node",
     lambda st: endpoint_of(st)["relabelings"].pop(0), "dashboard-labels"),
    ("up panel names another job",
     edit_expr("Driver targets", 'job="ferrovol-metrics"', 'job="ferrovol"'), "dashboard-labels"),
    ("node variable over a label the series lack",
     in_dashboard(lambda d: node_variable(d).update(
         query="label_values(ferrovol_volumes, nodename)")), "dashboard-labels"),
    ("panel without targets",
     in_dashboard(lambda d: panel_titled(d, "Volumes").pop("targets")), "dashboard"),
    ("panel with a hard-wired data source",
     in_dashboard(lambda d: panel_titled(d, IN_FLIGHT_PANEL)["datasource"].update(
         uid="prometheus")), "dashboard"),
    ("expression uses an undefined variable",
     edit_expr("Snapshots", "$node", "$nodes"), "dashboard"),
    ("panel ignores the node menu",
     edit_expr("Snapshots", '{node=~"$node"}', ""), "dashboard"),
    ("unbalanced parentheses", edit_expr(LATENCY_PANEL, ")))", "))"), "dashboard"),
    ("dashboard is not valid JSON",
     lambda st: st.update(dashboard=st["dashboard"].rstrip()[:-1]), "dashboard"),
    # the remaining ServiceMonitor rules
    ("base renders no metrics Service",
     lambda st: st["base"].remove(metrics_services(st["base"])[0]), "servicemonitor"),
    ("ServiceMonitor in another namespace",
     lambda st: monitor_of(st)["metadata"].update(namespace="monitoring"), "namespace"),
    ("ServiceMonitor elsewhere without a namespaceSelector",
     lambda st: (monitor_of(st)["metadata"].update(namespace="monitoring"),
                 monitor_of(st)["spec"].pop("namespaceSelector")), "servicemonitor"),
    ("ServiceMonitor copies a pod label ferrovol pods lack",
     lambda st: monitor_of(st)["spec"].update(podTargetLabels=["app.kubernetes.io/instance"]),
     "servicemonitor"),
    ("ServiceMonitor without endpoints",
     lambda st: monitor_of(st)["spec"].update(endpoints=[]), "servicemonitor"),
    ("ServiceMonitor scrapes over https", lambda st: endpoint_of(st).update(scheme="https"),
     "servicemonitor"),
    ("ServiceMonitor scrapes every second", lambda st: endpoint_of(st).update(interval="1s"),
     "servicemonitor"),
    ("relabeling reads a Service label the Service lacks",
     lambda st: endpoint_of(st)["relabelings"][1].update(
         sourceLabels=["__meta_kubernetes_service_label_team"]), "servicemonitor"),
    ("replace relabeling without a target label",
     lambda st: endpoint_of(st)["relabelings"][1].pop("targetLabel"), "servicemonitor"),
    # the remaining dashboard rules
    ("dashboard is a JSON list", lambda st: st.update(dashboard="[]"), "dashboard"),
    ("metrics table gone from src/metrics.rs",
     lambda st: st.update(source="\n".join(l for l in st["source"].splitlines()
                                             if not l.startswith("//! | `ferrovol_"))),
     "dashboard-metrics"),
    ("dashboard without a uid", in_dashboard(lambda d: d.pop("uid")), "dashboard"),
    ("dashboard schema older than Grafana 9",
     in_dashboard(lambda d: d.update(schemaVersion=16)), "dashboard"),
    ("dashboard exported with its database id", in_dashboard(lambda d: d.update(id=7)),
     "dashboard"),
    ("data source variable removed",
     in_dashboard(lambda d: d["templating"].update(list=[
         v for v in d["templating"]["list"] if v["type"] != "datasource"])), "dashboard"),
    ("node variable queries a fixed data source",
     in_dashboard(lambda d: node_variable(d)["datasource"].update(uid="prom")), "dashboard"),
    ("node variable is not a label_values query",
     in_dashboard(lambda d: node_variable(d).update(query="up")), "dashboard"),
    ("node variable removed",
     in_dashboard(lambda d: d["templating"]["list"].remove(node_variable(d))), "dashboard"),
    ("two panels with one id",
     in_dashboard(lambda d: panel_titled(d, "Snapshots").update(
         id=panel_titled(d, "Volumes")["id"])), "dashboard"),
    ("panel without a title", in_dashboard(lambda d: panel_titled(d, "Volumes").update(title="")),
     "dashboard"),
    ("panel wider than the grid",
     in_dashboard(lambda d: panel_titled(d, RATE_PANEL)["gridPos"].update(w=30)), "dashboard"),
    ("two targets with one refId",
     in_dashboard(lambda d: panel_titled(d, LATENCY_PANEL)["targets"][1].update(refId="A")),
     "dashboard"),
    ("target without an expression",
     in_dashboard(lambda d: panel_titled(d, RATE_PANEL)["targets"][0].update(expr=" ")),
     "dashboard"),
    ("target with a fixed data source",
     in_dashboard(lambda d: panel_titled(d, RATE_PANEL)["targets"][0]["datasource"].update(
         uid="prom")), "dashboard"),
    ("unterminated string", edit_expr(ERROR_PANEL, 'code!="OK"', 'code!="OK'), "dashboard"),
    ("matcher value not quoted", edit_expr("Snapshots", '"$node"', "$node"), "dashboard"),
    ("dashboard reads a series neither the driver nor Prometheus has",
     edit_expr("Volumes", "ferrovol_volumes", "kubelet_volume_stats_used_bytes"),
     "dashboard-metrics"),
    ("code regex names a code gRPC does not have",
     edit_expr(ERROR_PANEL, 'code!="OK"', 'code!~"OK|Aborted"'), "dashboard-labels"),
    ("histogram_quantile over a counter",
     edit_expr(LATENCY_PANEL, "ferrovol_rpc_duration_seconds_bucket",
               "ferrovol_rpc_requests_total"), "dashboard-metrics"),
]

EXAMPLE_MUTATIONS = [
    ("PVC names a class that does not exist", "pvc.yaml",
     lambda ex: _set(ex["pvc.yaml"][0], ["spec", "storageClassName"], "fast"), "examples-refs"),
    ("restore from a snapshot that does not exist", "pvc-restore.yaml",
     lambda ex: _set(ex["pvc-restore.yaml"][0], ["spec", "dataSource", "name"], "nope"),
     "examples-refs"),
    ("clone smaller than its expanded source", "pvc-clone.yaml",
     lambda ex: _set(ex["pvc-clone.yaml"][0], ["spec", "resources", "requests", "storage"], "1Gi"),
     "examples-refs"),
    ("block claim mounted as a filesystem", "pod-block.yaml",
     lambda ex: _block_as_mount(ex["pod-block.yaml"][0]), "examples-refs"),
    ("expansion patch shrinks", "pvc-expand.patch.yaml",
     lambda ex: _set(ex["pvc-expand.patch.yaml"][0], ["spec", "resources", "requests", "storage"],
                     "512Mi"), "examples-refs"),
    ("multi-node access mode", "pvc.yaml",
     lambda ex: _set(ex["pvc.yaml"][0], ["spec", "accessModes"], ["ReadWriteMany"]),
     "examples-refs"),
    ("typo in a PVC field", "pvc.yaml",
     lambda ex: _set(ex["pvc.yaml"][0], ["spec", "storageClass"], "ferrovol-ext4"), "schema"),
    ("VolumeSnapshot with two sources", "volumesnapshot.yaml",
     lambda ex: _set(ex["volumesnapshot.yaml"][0], ["spec", "source", "volumeSnapshotContentName"],
                     "c"), "crd-schema"),
    ("example pod image :latest", "pod.yaml",
     lambda ex: ex["pod.yaml"][0]["spec"]["containers"][0].update(image="busybox:latest"), "image"),
]


def _set(obj, path, value):
    cur = obj
    for key in path[:-1]:
        cur = cur.setdefault(key, {})
    cur[path[-1]] = value
    return obj


def _block_as_mount(pod):
    c = pod["spec"]["containers"][0]
    dev = c.pop("volumeDevices")[0]
    c["volumeMounts"] = [{"name": dev["name"], "mountPath": "/raw"}]


# --------------------------------------------------------------------------------------------
# Commands


def overlay_dir(name):
    return REPO / "deploy" / "kubernetes" / "overlays" / name


def examples_inputs(directory, kubectl):
    examples = load_dir(directory)
    readme = Path(directory) / "README.md"
    base = render(kubectl, REPO / "deploy" / "kubernetes" / "base")
    return examples, base, (readme.read_text() if readme.exists() else None)


def cmd_overlay(args):
    status = 0
    versions = k8s_versions()
    for directory in args.dirs:
        try:
            objs = render(args.kubectl, directory)
        except (RuntimeError, ValueError) as e:
            print(f"FAIL [render] {directory}: {e}")
            status = 1
            continue
        f = check_deployment(objs, versions)
        if f:
            f.report()
            status = 1
        else:
            kinds = sorted({o["kind"] for o in objs})
            print(f"ok: {directory}: {len(objs)} objects ({', '.join(kinds)}) pass every check "
                  f"against Kubernetes {' and '.join(versions)}")
    return status


def cmd_examples(args):
    examples, base, readme = examples_inputs(args.dir, args.kubectl)
    if not examples:
        print(f"FAIL [examples-coverage] {args.dir}: no *.yaml files")
        return 1
    versions = k8s_versions()
    f = check_examples(examples, base, versions, readme)
    if f:
        f.report()
        return 1
    print(f"ok: {args.dir}: {len(examples)} objects in "
          f"{len({n for n, _ in examples})} files pass every check against Kubernetes "
          f"{' and '.join(versions)}")
    return 0


def cmd_monitoring(args):
    versions = k8s_versions()
    try:
        objs, base, overlays, dashboard, source = monitoring_inputs(args.kubectl, args.dir)
    except (RuntimeError, ValueError) as e:
        print(f"FAIL [render] {args.dir}: {e}")
        return 1
    f = check_monitoring(objs, base, overlays, dashboard, source, versions)
    if f:
        f.report()
        return 1
    parsed = json.loads(dashboard)
    exprs = [t["expr"] for p in panels_of(parsed) for t in p.get("targets") or []]
    used = {series_of(n, driver_metrics(source))[0] for e in exprs for n in Promql(e).series}
    kinds = sorted({o["kind"] for o in objs})
    print(f"ok: {args.dir}: {len(objs)} objects ({', '.join(kinds)}) and {DASHBOARD_FILE} "
          f"({len(panels_of(parsed))} panels, {len(exprs)} expressions over {len(used)} of the "
          f"driver's {len(driver_metrics(source))} metrics) pass every check")
    return 0


def expect_of(fixture):
    return set((fixture / "EXPECT").read_text().split())


def cmd_mutations(args):
    versions = k8s_versions()
    rendered = {}
    for name in (S, M):
        rendered[name] = render(args.kubectl, overlay_dir(name))
        baseline = check_deployment(rendered[name], versions)
        if baseline:
            baseline.report()
            print(f"FAIL: the unmodified {name} overlay does not pass, so mutations prove nothing")
            return 1
    examples_dir = REPO / "deploy" / "examples"
    examples, base, readme = examples_inputs(examples_dir, args.kubectl)
    baseline = check_examples(examples, base, versions, readme)
    if baseline:
        baseline.report()
        print("FAIL: the unmodified examples do not pass, so mutations prove nothing")
        return 1

    monitoring = monitoring_inputs(args.kubectl, MONITORING_DIR,
                                   overlays=[rendered[S], rendered[M]])
    baseline = check_monitoring(*monitoring, versions)
    if baseline:
        baseline.report()
        print("FAIL: the unmodified monitoring directory does not pass, so mutations prove "
              "nothing")
        return 1

    results = []  # (name, caught, detail)

    def judge(name, expected, findings):
        if not findings:
            results.append((name, False, f"passed every check; expected [{expected}] to fail"))
        elif expected not in findings.checks():
            got = ", ".join(sorted(findings.checks()))
            results.append((name, False, f"rejected by [{got}], not by [{expected}]"))
        else:
            first = next(m for c, w, m in findings.items if c == expected)
            results.append((name, True, f"[{expected}] {first}"))

    for name, overlay, mutate, expected in MUTATIONS:
        objs = copy.deepcopy(rendered[overlay])
        try:
            mutate(objs)
        except (LookupError, KeyError, IndexError) as e:
            results.append((name, False, f"mutation does not apply any more: {e!r}"))
            continue
        judge(f"{overlay}: {name}", expected, check_deployment(objs, versions))

    for name, file, mutate, expected in EXAMPLE_MUTATIONS:
        by_file = {}
        for n, o in copy.deepcopy(examples):
            by_file.setdefault(n, []).append(o)
        try:
            mutate(by_file)
        except (LookupError, KeyError, IndexError) as e:
            results.append((name, False, f"mutation does not apply any more: {e!r}"))
            continue
        mutated = [(n, o) for n in sorted(by_file) for o in by_file[n]]
        judge(f"examples: {name}", expected, check_examples(mutated, base, versions, readme))

    objs, base_objs, overlays, dashboard, source = monitoring
    for name, mutate, expected in MONITORING_MUTATIONS:
        state = {"objs": copy.deepcopy(objs), "base": copy.deepcopy(base_objs),
                 "dashboard": dashboard, "source": source}
        try:
            mutate(state)
        except (LookupError, KeyError, IndexError, ValueError) as e:
            results.append((name, False, f"mutation does not apply any more: {e!r}"))
            continue
        judge(f"monitoring: {name}", expected,
              check_monitoring(state["objs"], state["base"], overlays, state["dashboard"],
                               state["source"], versions))

    # Fixtures on disk go through the real tools: kustomize overlays of the real overlays and
    # of the monitoring directory (fixtures named monitoring-*), and example directories.
    for fixture in sorted(p for p in FIXTURES.iterdir() if p.is_dir()):
        expected = expect_of(fixture)
        label = f"fixture {fixture.name}"
        if fixture.name.startswith("monitoring-"):
            try:
                inputs = monitoring_inputs(args.kubectl, fixture,
                                           overlays=[rendered[S], rendered[M]])
            except RuntimeError as e:
                results.append((label, "render" in expected, f"[render] {e}"))
                continue
            f = check_monitoring(*inputs, versions)
        elif (fixture / "kustomization.yaml").exists():
            try:
                objs = render(args.kubectl, fixture)
            except RuntimeError as e:
                results.append((label, "render" in expected, f"[render] {e}"))
                continue
            f = check_deployment(objs, versions)
        else:
            f = check_examples(load_dir(fixture), base, versions, None)
        for check in sorted(expected):
            judge(label, check, f)

    caught = sum(1 for _, ok, _ in results if ok)
    for name, ok, detail in results:
        print(f"{'caught' if ok else 'MISSED'}: {name}: {detail}")
    print(f"mutations caught: {caught} of {len(results)}")
    return 0 if caught == len(results) else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubectl", default=os.environ.get("KUBECTL", "kubectl"))
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("overlay")
    p.add_argument("dirs", nargs="+", type=Path)
    p = sub.add_parser("examples")
    p.add_argument("dir", type=Path)
    p = sub.add_parser("monitoring")
    p.add_argument("dir", type=Path)
    sub.add_parser("mutations")
    sub.add_parser("preflight")
    args = parser.parse_args(argv)

    missing = missing_tools(args.kubectl)
    if missing:
        fail_missing(missing)
    if args.command == "preflight":
        print("preflight: kubectl, pyyaml, kubernetes-validate and jsonschema are installed")
        return 0
    return {"overlay": cmd_overlay, "examples": cmd_examples, "monitoring": cmd_monitoring,
            "mutations": cmd_mutations}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
