"""Assembles a wheel (PEP 427) from files built by Bazel; deterministic (fixed timestamps, sorted entries).

Usage:
  build_wheel.py --out FILE.whl --name DIST --version V --tag cp311-cp311-linux_x86_64
                 [--summary TEXT] [--requires REQ ...] [--console-script NAME=module:func ...]
                 [--readme README.md] DEST=SRC ...
DEST=SRC puts file SRC at DEST inside the wheel (e.g. mooncake/engine.py=python/mooncake/engine.py).
DIR/:ROOT=SRC puts SRC under DIR/ at its path relative to the package folder ROOT, for source files
(ROOT/x/y.py) and generated ones (bazel-out/.../bin/ROOT/x/y.py) alike: mooncake/store/:store=<file>.
"""

import argparse
import base64
import hashlib
import os
import sys
import zipfile

_EPOCH = (1980, 1, 1, 0, 0, 0)


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _expand(mapping: str):
    dest, _, src = mapping.partition("=")
    if not src:
        raise SystemExit(f"bad mapping {mapping!r}: expected DEST=SRC")
    if ":" not in dest:
        return dest, src
    directory, _, root = dest.partition(":")
    root = root.strip("/") + "/"
    if src.startswith(root):
        rel = src[len(root):]
    elif "/bin/" + root in src:
        rel = src.split("/bin/" + root, 1)[1]
    else:
        raise SystemExit(f"{src} is not under the package folder {root}")
    return directory + rel, src


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--summary", default="")
    p.add_argument("--readme")
    p.add_argument("--requires", action="append", default=[])
    p.add_argument("--extra", action="append", default=[], help="optional-dependency group names")
    p.add_argument("--console-script", action="append", default=[])
    p.add_argument("files", nargs="*")
    args = p.parse_args(argv)

    dist = args.name.replace("-", "_")
    info = f"{dist}-{args.version}.dist-info"
    entries = {}
    for mapping in args.files:
        dest, src = _expand(mapping)
        with open(src, "rb") as f:
            entries[dest] = (f.read(), os.access(src, os.X_OK))

    meta = [
        "Metadata-Version: 2.1",
        f"Name: {args.name}",
        f"Version: {args.version}",
        f"Summary: {args.summary}",
        "Requires-Python: >=3.10",
    ]
    meta += [f"Provides-Extra: {e}" for e in args.extra]
    meta += [f"Requires-Dist: {r}" for r in args.requires]
    body = ""
    if args.readme:
        meta.append("Description-Content-Type: text/markdown")
        with open(args.readme, encoding="utf-8") as f:
            body = "\n" + f.read()
    entries[f"{info}/METADATA"] = (("\n".join(meta) + "\n" + body).encode(), False)
    entries[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: mooncake-build-wheel\nRoot-Is-Purelib: false\nTag: {args.tag}\n".encode(),
        False,
    )
    if args.console_script:
        scripts = "[console_scripts]\n" + "".join(f"{s.replace('=', ' = ', 1)}\n" for s in args.console_script)
        entries[f"{info}/entry_points.txt"] = (scripts.encode(), False)

    record = [_record_line(path, data) for path, (data, _) in sorted(entries.items())]
    record.append(f"{info}/RECORD,,")
    entries[f"{info}/RECORD"] = (("\n".join(record) + "\n").encode(), False)

    with zipfile.ZipFile(args.out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(entries):
            data, executable = entries[path]
            zi = zipfile.ZipInfo(path, date_time=_EPOCH)
            zi.external_attr = (0o755 if executable else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
