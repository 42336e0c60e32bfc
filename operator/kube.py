"""A small generic Kubernetes client for the fleet's children: any resource, plain dicts.

It rides on the official client's ApiClient (auth, TLS, in-cluster or kubeconfig) and asks it
for raw JSON, so every kind is handled alike and nothing is lost to model classes.
"""

from __future__ import annotations

import json
from typing import Any

import kubernetes
import urllib3

from .children import Resource

MERGE_PATCH = "application/merge-patch+json"
# (connect, read) seconds for one call. An API server answers these small calls in
# milliseconds; a call that stalls is given up soon, and the next tick tries again, so one
# stall costs a fleet's tick at most CONNECT + (1 + RETRIES) x READ seconds, not minutes.
REQUEST_TIMEOUT_SECONDS = (5.0, 10.0)
# One retry of a dropped connection or a timed-out read (urllib3's default is three, which
# with the old 30 s read timeout held one fleet's reconcile for up to ~90 s).
RETRIES = urllib3.Retry(total=1, backoff_factor=0.2, raise_on_status=False)


class KubeApi:
    """Create, read, merge-patch, list and delete namespaced objects as dicts."""

    def __init__(
        self,
        configuration: kubernetes.client.Configuration,
        request_timeout: tuple[float, float] = REQUEST_TIMEOUT_SECONDS,
    ) -> None:
        configuration.retries = RETRIES
        self._client = kubernetes.client.ApiClient(configuration)
        self._request_timeout = request_timeout
        self._served: set[str] | None = None

    @classmethod
    def from_environment(
        cls, request_timeout: tuple[float, float] = REQUEST_TIMEOUT_SECONDS
    ) -> KubeApi:
        """In a pod: the service account; elsewhere: $KUBECONFIG or ~/.kube/config."""
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(client_configuration=configuration)
        return cls(configuration, request_timeout)

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list | None = None,
        content_type: str | None = None,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        method, url, headers, body, post_params = self._client.param_serialize(
            method, path, query_params=query or [], header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )  # fmt: skip
        response = self._client.call_api(
            method, url, header_params=headers, body=body, post_params=post_params,
            _request_timeout=self._request_timeout,
        )  # fmt: skip
        data = response.read()
        if not 200 <= response.status <= 299:
            raise kubernetes.client.ApiException.from_response(
                http_resp=response, body=data.decode(errors="replace"), data=None
            )
        return json.loads(data) if data else None

    def get(self, resource: Resource, namespace: str, name: str) -> dict | None:
        """The object, or None when it does not exist."""
        return self.read(resource.object_path(namespace, name))

    def read(self, path: str) -> dict | None:
        """The object at this URL path (cluster-scoped ones too), or None when it does not exist."""
        try:
            return self._call("GET", path)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def served(self) -> set[str]:
        """The group/versions this server serves ("v1", "apps/v1", ...), asked once."""
        if self._served is None:
            groups = self._call("GET", "/apis") or {}
            self._served = {"v1"} | {
                version["groupVersion"]
                for group in groups.get("groups", [])
                for version in group.get("versions", [])
            }
        return self._served

    def list(self, resource: Resource, namespace: str, labels: dict[str, str]) -> list[dict]:
        """Objects whose labels include `labels` (also filtered here, so any server will do);
        none for a resource this server does not serve."""
        selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
        try:
            found = self._call(
                "GET", resource.collection_path(namespace), query=[("labelSelector", selector)]
            )
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return []
            raise
        items = (found or {}).get("items", [])
        return [
            item
            for item in items
            if labels.items() <= item.get("metadata", {}).get("labels", {}).items()
        ]

    def create(self, resource: Resource, namespace: str, body: dict) -> dict:
        """Create the object from `body`."""
        return self._call("POST", resource.collection_path(namespace), body=body)

    def patch(self, resource: Resource, namespace: str, name: str, patch: dict) -> dict | None:
        """Apply a JSON merge patch; None when the object does not exist."""
        return self.merge_patch(resource.object_path(namespace, name), patch)

    def merge_patch(self, path: str, patch: dict) -> dict | None:
        """Merge-patch the object at this URL path; None when it does not exist."""
        try:
            return self._call("PATCH", path, body=patch, content_type=MERGE_PATCH)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_status(self, resource: Resource, namespace: str, name: str, patch: dict) -> None:
        """Merge-patch the status subresource; nothing when the object is gone."""
        path = resource.object_path(namespace, name) + "/status"
        try:
            self._call("PATCH", path, body=patch, content_type=MERGE_PATCH)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise

    def delete(self, resource: Resource, namespace: str, name: str) -> bool:
        """Delete the object (its dependents go in the background); False when it was gone."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        try:
            self._call("DELETE", resource.object_path(namespace, name), body=body)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True
