"""``kubectl get … -o json`` and ``kubectl logs`` answered in the calling process.

The tests poll the API server every second or two (a resource's status, a Job's log, a node), and a
kubectl process costs about 0.1 s of CPU to start, read its kubeconfig and parse its discovery
cache: thousands of polls in a run of the suites are minutes of CPU. :class:`ApiReads` sends the same
GET to the API server through a ``request`` function its owner gives (the control plane's HTTPS
client, the kubernetes client on kind) and returns what kubectl would print, parsed. Resource names
are resolved as kubectl resolves them, by the server's discovery (plural, singular and short names,
the core group first), read once and again when a name is not found (a CRD installed since). What it
does not speak (several kinds at once, ``kind/name``, an output other than JSON, a flag it does not
know) it declines with None, and the caller runs kubectl.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

#: ``request(path, query, accept_json)`` -> (HTTP status, body); raises ``OSError`` when no answer came
Request = Callable[[str, Sequence[tuple[str, str]], bool], tuple[int, bytes]]

_FLAGS = {"-n": "namespace", "--namespace": "namespace", "-l": "labelSelector", "--selector": "labelSelector",
          "--field-selector": "fieldSelector"}  # fmt: skip


class ApiReadError(Exception):
    """The API server refused the read (its message), or did not answer: where kubectl exits non-zero."""


class ApiReads:
    def __init__(self, request: Request) -> None:
        self._request_fn = request
        self._names: dict[str, tuple[str, str, bool]] = {}  # name -> (group-version path, plural, namespaced)
        self._lock = threading.Lock()

    def _request(
        self, path: str, query: Sequence[tuple[str, str]] = (), *, json_body: bool = True
    ) -> tuple[int, bytes]:
        try:
            return self._request_fn(path, query, json_body)
        except OSError as exc:  # the API server away (a test restarts it): as kubectl fails
            raise ApiReadError(f"GET {path}: {exc}") from exc

    def _discover(self) -> None:
        names: dict[str, tuple[str, str, bool]] = {}

        def add(prefix: str) -> None:
            status, body = self._request(prefix)
            for r in json.loads(body).get("resources", []) if status == 200 else []:
                if "/" in r["name"] or "get" not in r.get("verbs", []):
                    continue  # subresources, and kinds that cannot be read
                for alias in (r["name"], r.get("singularName") or r["kind"].lower(), *r.get("shortNames", [])):
                    names.setdefault(alias, (prefix, r["name"], r["namespaced"]))

        add("/api/v1")  # the core group first, as kubectl prefers it (events)
        status, body = self._request("/apis")
        for group in json.loads(body).get("groups", []) if status == 200 else []:
            add(f"/apis/{group['preferredVersion']['groupVersion']}")
        with self._lock:
            self._names = names

    def _resolve(self, name: str) -> tuple[str, str, bool] | None:
        if name not in self._names:
            self._discover()
        return self._names.get(name)

    def get(self, args: Sequence[str]) -> Any | None:
        """What ``kubectl get *args -o json`` prints, parsed; None for arguments left to kubectl.
        Raises :class:`ApiReadError` where kubectl would fail (not found, forbidden, no answer)."""
        words: list[str] = []
        options: dict[str, str] = {}
        all_namespaces = False
        rest = iter(args)
        for arg in rest:
            if arg in _FLAGS:
                options[_FLAGS[arg]] = next(rest, "")
            elif arg in ("-A", "--all-namespaces"):
                all_namespaces = True
            elif arg.startswith("-") or any(c in arg for c in ",/."):
                return None
            else:
                words.append(arg)
        if not 1 <= len(words) <= 2 or (all_namespaces and len(words) == 2):
            return None
        resolved = self._resolve(words[0])
        if resolved is None:
            return None  # kubectl says what is wrong with the name
        prefix, plural, namespaced = resolved
        namespace = options.pop("namespace", "default")
        path = prefix + (f"/namespaces/{namespace}" if namespaced and not all_namespaces else "") + f"/{plural}"
        path += f"/{words[1]}" if len(words) == 2 else ""
        status, raw = self._request(path, sorted(options.items()))
        body = json.loads(raw) if raw else {}
        if status != 200:  # as kubectl says it
            raise ApiReadError(f"Error from server ({body.get('reason', status)}): {body.get('message', '')}")
        if len(words) == 1:  # a list, as kubectl prints one: each item with its kind and apiVersion
            kind = str(body.get("kind", "")).removesuffix("List")
            items = [{"kind": kind, "apiVersion": body.get("apiVersion"), **_shown(i)} for i in body.get("items", [])]
            return {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}
        return _shown(body)

    def answer(self, args: Sequence[str], *, check: bool, error: type[Exception]) -> str | None:
        """What ``kubectl *args`` prints when ``args`` is ``get … -o json`` and :meth:`get` speaks it;
        None for any other command. A refusal raises ``error`` with kubectl's words (``check``), or
        prints nothing, as kubectl's failure does."""
        if args[:1] != ("get",) or tuple(args[-2:]) != ("-o", "json"):
            return None
        try:
            found = self.get(args[1:-2])
        except ApiReadError as exc:
            if check:
                raise error(f"kubectl {' '.join(args)} failed: {exc}") from exc
            return ""
        return None if found is None else json.dumps(found, indent=4)

    def log(self, target: str, namespace: str, *, previous: bool = False) -> str | None:
        """What ``kubectl logs target -n namespace`` prints, for a pod or a Job's one pod, of one
        container; None for anything else (a Job with more pods, a pod of several containers), which
        kubectl answers."""
        pod = target
        if target.startswith("job/"):
            pods = self.get(("pods", "-n", namespace, "-l", f"job-name={target[4:]}"))
            if pods is None or len(pods["items"]) != 1:
                return None
            pod = pods["items"][0]["metadata"]["name"]
        elif "/" in target:
            return None
        query = [("previous", "true")] if previous else []
        status, raw = self._request(f"/api/v1/namespaces/{namespace}/pods/{pod}/log", query, json_body=False)
        text = raw.decode(errors="replace")
        if status != 200:
            said = str(json.loads(text).get("message", status)) if text.startswith("{") else text or str(status)
            if "container name must be specified" in said:
                return None
            raise ApiReadError(said)
        return text


def _shown(item: dict[str, Any]) -> dict[str, Any]:
    """``item`` as kubectl prints it: without ``metadata.managedFields``."""
    item.get("metadata", {}).pop("managedFields", None)
    return item
