#!/usr/bin/env python3
"""Forwards TCP for the real node (hack/node.sh, tests/support/node.rs):

  hack/netns-forward.py --netns PID 127.0.0.1:PORT=ADDR:PORT ...
      from loopback ports of this machine to addresses inside the network namespace of process
      PID, so tests and kubectl reach the node's servers through 127.0.0.1 only; nothing inside
      the namespace is reachable from anywhere else. It binds every listener first, in this
      machine's namespace, then joins PID's (setns): every connection it opens from then on
      starts inside it.
  nsenter -t PID --net hack/netns-forward.py --delay-file F ADDR:PORT=ADDR:PORT ...
      run inside a node's namespace: a path to a server there that can be made slow (each chunk
      of bytes waits the milliseconds file F holds, 0 when it is missing or empty, read again
      every half second), for tests that need a pass to take longer than a Pod may live.
      It listens on one address, never all of them (0.0.0.0): the node IP exists only inside the
      node's namespace, so the bind fails anywhere else.
"""
import argparse
import ctypes
import os
import socket
import sys
import threading
import time

CLONE_NEWNET = 0x40000000


class Delay:
    """The delay a chunk waits: the milliseconds in a file, re-read every half second."""

    def __init__(self, path):
        self.path, self.value, self.read_at = path, 0.0, 0.0

    def seconds(self):
        if not self.path:
            return 0.0
        now = time.monotonic()
        if now - self.read_at > 0.5:
            self.read_at = now
            try:
                with open(self.path) as f:
                    self.value = float(f.read().strip() or 0) / 1000
            except (OSError, ValueError):
                self.value = 0.0
        return self.value


def pump(src, dst, delay):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            wait = delay.seconds()
            if wait:
                time.sleep(wait)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def serve(listener, target, delay):
    while True:
        client, _ = listener.accept()
        try:
            upstream = socket.create_connection(target, timeout=10)
            upstream.settimeout(None)
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(a, b, delay), daemon=True).start()


def addr(text):
    host, port = text.rsplit(":", 1)
    return host, int(port)


def main():
    p = argparse.ArgumentParser(description="TCP forwarding for the real node's namespaces")
    p.add_argument("--netns", type=int, help="join this process's network namespace after binding")
    p.add_argument("--delay-file", help="milliseconds each chunk waits, read from this file")
    p.add_argument("pairs", nargs="+", metavar="LISTEN=TARGET")
    a = p.parse_args()
    routes = []
    for pair in a.pairs:
        listen, target = pair.split("=", 1)
        lhost, lport = addr(listen)
        if lhost in ("", "0.0.0.0", "::", "[::]"):
            sys.exit("netns-forward: listens on one address, not on all of them")
        if a.netns and lhost != "127.0.0.1":
            sys.exit(f"netns-forward: --netns forwards from loopback only, not {lhost}")
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((lhost, lport))
        s.listen(64)
        routes.append((s, addr(target)))
    if a.netns:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/proc/{a.netns}/ns/net", os.O_RDONLY)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            sys.exit(f"netns-forward: setns: {os.strerror(ctypes.get_errno())}")
        os.close(fd)
    delay = Delay(a.delay_file)
    threads = [threading.Thread(target=serve, args=(s, t, delay), daemon=True) for s, t in routes]
    for t in threads:
        t.start()
    print("netns-forward: ready", flush=True)
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
