"""Open a TLS connection to each ZooKeeper server at HOST:PORT (an election port, 3888 in the chart) as
a peer would: trusting only the CA in DIR/ca.crt, once presenting DIR/tls.crt (the ensemble's
certificate) and once presenting none. Prints one JSON line per server and attempt:
``{"server": HOST:PORT, "certificate": bool, "answer": "open" | "refused", "peer": CN}`` ("open": the
handshake succeeded and the server kept the connection; "peer": the common name of the certificate it
presented). Standard library only: runs on this machine (the integration test) and in the ZooKeeper
image (kind).

usage: zookeeper_tls_peer.py DIR HOST:PORT [HOST:PORT ...]"""

import json
import socket
import ssl
import sys
from pathlib import Path


def attempt(folder: Path, host: str, port: int, *, certificate: bool) -> dict[str, object]:
    context = ssl.create_default_context(cafile=str(folder / "ca.crt"))
    context.check_hostname = False  # the servers check a peer's CA, not its name; so does this
    if certificate:
        context.load_cert_chain(str(folder / "tls.crt"), str(folder / "tls.key"))
    answer: dict[str, object] = {"server": f"{host}:{port}", "certificate": certificate}
    try:
        with socket.create_connection((host, port), timeout=10) as raw, context.wrap_socket(raw) as conn:
            peer = dict(item[0] for item in conn.getpeercert()["subject"])["commonName"]
            conn.settimeout(3)
            try:  # TLS 1.3: a server's refusal of this end's certificate arrives at the first read
                closed = conn.recv(1) == b""
            except TimeoutError:  # a peer waits for this end's handshake message: kept open
                closed = False
            answer |= {"answer": "refused" if closed else "open", "peer": peer}
    except (ssl.SSLError, OSError) as exc:
        answer |= {"answer": "refused", "error": str(exc)}
    return answer


def main() -> None:
    folder = Path(sys.argv[1])
    for server in sys.argv[2:]:
        host, port = server.rsplit(":", 1)
        for certificate in (True, False):
            print(json.dumps(attempt(folder, host, int(port), certificate=certificate)), flush=True)


if __name__ == "__main__":
    main()
