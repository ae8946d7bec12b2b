#!/usr/bin/env python3
"""Writes a FROM-scratch image as a docker-archive (what `ctr images import` and `podman load`
read) from files on this machine, with no registry and no image builder: the real node's pod
sandbox image (hack/node.sh) is one static binary.

  hack/scratch-image.py NAME:TAG OUT.tar --entrypoint /pause HOST_FILE:/IMAGE/PATH ...
"""
import argparse
import hashlib
import io
import json
import os
import tarfile


def layer(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for host, path in files:
            info = tar.gettarinfo(host, arcname=path.lstrip("/"))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with open(host, "rb") as f:
                tar.addfile(info, f)
    return buf.getvalue()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ref")
    p.add_argument("out")
    p.add_argument("--entrypoint", required=True)
    p.add_argument("--user", default="65535:65535")
    p.add_argument("files", nargs="+", help="HOST_FILE:/IMAGE/PATH")
    a = p.parse_args()
    files = [tuple(f.split(":", 1)) for f in a.files]
    data = layer(files)
    diff = hashlib.sha256(data).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": [a.entrypoint], "User": a.user},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff]},
        "history": [{"created_by": "hack/scratch-image.py"}],
    }
    cfg = json.dumps(config, sort_keys=True).encode()
    cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
    manifest = [{"Config": cfg_name, "RepoTags": [a.ref], "Layers": [diff + "/layer.tar"]}]
    tmp = a.out + ".tmp"
    with tarfile.open(tmp, mode="w") as tar:
        for name, blob in ((diff + "/layer.tar", data), (cfg_name, cfg),
                           ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
