"""Sidecar pods found through Kubernetes EndpointSlices (discovery.k8s.io/v1).

The Service's EndpointSlices carry the label `kubernetes.io/service-name`; every endpoint with
`conditions.ready` is a target, the ones not ready yet are replicas still starting (cold start),
which the policy counts as capacity on its way. An endpoint first seen not ready and later ready
took that long to start: the cold start, learned (the median of the recent ones) and used as the
policy's cold start unless a flag sets it. Times are as fine as the refresh interval.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque


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
        self._first_not_ready: dict[str, float] = {}   # endpoint -> when first seen not ready
        self._seen: set[str] = set()                    # every endpoint seen (so a pod seen ready
                                                        # first is never timed from a later blip)
        self.cold_starts: deque[float] = deque(maxlen=20)
        self._clock = time.monotonic

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
        now = self._clock()
        present = set()
        for sl in slices.items or []:
            port = self._pick_port(sl.ports or [])
            if port is None:
                continue
            for ep in sl.endpoints or []:
                cond = ep.conditions
                if cond is not None and cond.terminating:
                    continue  # draining: neither capacity now nor on its way
                key = _identity(ep)
                present.add(key)
                if cond is None or cond.ready is None or cond.ready:
                    host = ep.addresses[0]
                    host = f"[{host}]" if ":" in host else host
                    ready.append(f"{self.scheme}://{host}:{port}{self.path}")
                    began = self._first_not_ready.pop(key, None)
                    if began is not None:
                        self.cold_starts.append(now - began)
                else:
                    starting += 1
                    if key not in self._seen:
                        self._first_not_ready[key] = now
                self._seen.add(key)
        for gone in set(self._first_not_ready) - present:
            del self._first_not_ready[gone]   # deleted before it was ready: no cold start to learn
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

    def cold_start_seconds(self) -> float | None:
        """The median of the recent cold starts seen, or None before the first."""
        return statistics.median(self.cold_starts) if self.cold_starts else None


def _identity(ep) -> str:
    """A pod's endpoint across refreshes: its targetRef (the pod) where set, else its address."""
    ref = getattr(ep, "target_ref", None)
    if ref is not None and getattr(ref, "name", None):
        return f"{ref.namespace or ''}/{ref.name}"
    return ",".join(ep.addresses or [])


def _default_client():
    """In-cluster service account if there is one, else the local kubeconfig."""
    from kubernetes import client as k8s
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return k8s.ApiClient()
