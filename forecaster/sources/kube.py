"""Sidecar pods found through Kubernetes EndpointSlices (discovery.k8s.io/v1).

The Service's EndpointSlices carry the label `kubernetes.io/service-name`; every endpoint with
`conditions.ready` is a target, the ones not ready yet are replicas still starting (cold start),
which the policy counts as capacity on its way.
"""

from __future__ import annotations

import threading
import time


class EndpointSliceDiscovery:
    def __init__(self, namespace: str, service: str, port_name: str | None = None, port: int | None = None,
                 api_client=None, refresh_seconds: float = 15.0, path: str = "/metrics", scheme: str = "http"):
        from kubernetes import client as k8s

        self.namespace, self.service = namespace, service
        self.port_name, self.port = port_name, port
        self.refresh_seconds = refresh_seconds
        self.path, self.scheme = path, scheme
        self._api = k8s.DiscoveryV1Api(api_client or _default_client())
        self._lock = threading.Lock()
        self._ready: list[str] = []
        self._starting = 0
        self._fetched_at = -float("inf")
        self.last_error: str | None = None

    def refresh(self) -> None:
        from kubernetes.client.rest import ApiException

        try:
            slices = self._api.list_namespaced_endpoint_slice(
                self.namespace, label_selector=f"kubernetes.io/service-name={self.service}")
        except (ApiException, OSError) as exc:
            # Keep the last known targets: a blip of the API server must not empty the fleet.
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        ready, starting = [], 0
        for sl in slices.items or []:
            port = self._pick_port(sl.ports or [])
            if port is None:
                continue
            for ep in sl.endpoints or []:
                cond = ep.conditions
                if cond is not None and cond.terminating:
                    continue  # draining: neither capacity now nor on its way
                if cond is None or cond.ready is None or cond.ready:
                    host = ep.addresses[0]
                    host = f"[{host}]" if ":" in host else host
                    ready.append(f"{self.scheme}://{host}:{port}{self.path}")
                else:
                    starting += 1
        with self._lock:
            self._ready, self._starting = sorted(set(ready)), starting
            self._fetched_at = time.monotonic()
        self.last_error = None

    def _pick_port(self, ports) -> int | None:
        if self.port is not None:
            return self.port
        for p in ports:
            if self.port_name is None or p.name == self.port_name:
                return p.port
        return None

    def _maybe_refresh(self) -> None:
        if time.monotonic() - self._fetched_at >= self.refresh_seconds:
            self.refresh()

    def targets(self) -> list[str]:
        self._maybe_refresh()
        with self._lock:
            return list(self._ready)

    def starting(self) -> int:
        with self._lock:
            return self._starting


def _default_client():
    """In-cluster service account if there is one, else the local kubeconfig."""
    from kubernetes import client as k8s
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return k8s.ApiClient()
