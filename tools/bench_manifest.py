#!/usr/bin/env python3
"""Measures manifest hashing and verification against sha256sum; exit 1 when a GUIDE §9 throughput target is missed.

Not a test: it prints throughput and ratios for the GUIDE §9 targets, which are
  * build_pull_manifest.py on ONE large file   >= 0.9x the throughput of `sha256sum FILE`;
  * on MANY small files                        faster than sha256sum run once per file in a loop;
  * verification (pull_verified.verify_tree)   the same two targets.
sha256sum over all small files in ONE call is reported too, for context (no process per file).

Everything runs from a warm page cache (each data set is read once first), so the numbers measure
hashing and per-file overhead, not the disk. Each timing is the best of --repeat runs, and includes
process start-up on both sides.

Usage:
  bench_manifest.py [--size-mb 1024] [--small-count 5000] [--small-kb 64] [--buffer-mb 1,4,8]
                    [--jobs N] [--repeat 3] [--dir DIR] [--keep] [--json]

Exit codes:
  0  all targets met
  1  a target was missed (the table says which)
  2  usage, sha256sum/bash missing, or not enough free disk for the data set
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NODE = os.path.join(HERE, "..", "scripts", "node")
LAPTOP = os.path.join(HERE, "..", "scripts")
BUILD = os.path.join(NODE, "build_pull_manifest.py")
VERIFY_SNIPPET = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); import pull_verified as pv\n"
    "m = json.load(open(sys.argv[2]))\n"
    "problems, _ = pv.verify_tree(sys.argv[3], m, int(sys.argv[4]))\n"
    "sys.exit(1 if problems else 0)\n"
)


def best_of(repeat: int, argv, **kwargs) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kwargs)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"{argv[:3]} failed: {done.stderr.decode(errors='replace')[-300:]}")
        best = min(best, elapsed)
    return best


def write_random(path: str, size: int):
    chunk = os.urandom(8 * 1024 * 1024)
    with open(path, "wb") as handle:
        left = size
        while left > 0:
            handle.write(chunk[:min(left, len(chunk))] if left < len(chunk) else chunk)
            left -= len(chunk)
            chunk = chunk[1:] + chunk[:1]  # cheap variation so blocks differ


def warm(paths):
    for path in paths:
        with open(path, "rb") as handle:
            while handle.read(8 * 1024 * 1024):
                pass


class Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr (exit 2), not the whole usage block."""
    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message} (try --help)\n")
        sys.exit(2)


def main() -> int:
    parser = Parser(description="Hashing throughput vs sha256sum (GUIDE §9 targets).",
                    formatter_class=argparse.RawDescriptionHelpFormatter,
                    epilog=__doc__[__doc__.index("Exit codes:"):].strip())  # the docstring states them once
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the one large file (MiB)")
    parser.add_argument("--small-count", type=int, default=5000, help="number of small files")
    parser.add_argument("--small-kb", type=int, default=64, help="size of each small file (KiB)")
    parser.add_argument("--buffer-mb", default="1,4,8", help="read buffer sizes to try, comma-separated MiB")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="hashing workers (default: CPUs, at most 8)")
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs per timing")
    parser.add_argument("--dir", help="where to create the data (default: a temp dir under $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the generated data")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    sha256sum, bash = shutil.which("sha256sum"), shutil.which("bash")
    if not sha256sum or not bash:
        print("bench_manifest: needs sha256sum and bash (coreutils)", file=sys.stderr)
        return 2
    try:
        buffers = [float(b) for b in args.buffer_mb.split(",") if b.strip()]
    except ValueError:
        print("bench_manifest: --buffer-mb takes comma-separated numbers", file=sys.stderr)
        return 2
    if not buffers or min(args.size_mb, args.small_count, args.small_kb, args.repeat, args.jobs) < 1:
        print("bench_manifest: sizes, counts, --repeat and --jobs must be positive", file=sys.stderr)
        return 2
    if not all(0.0625 <= b <= 256 for b in buffers):   # build_pull_manifest.py's own limits; also nan
        print("bench_manifest: each --buffer-mb must be between 0.0625 and 256", file=sys.stderr)
        return 2
    base = args.dir or tempfile.gettempdir()
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as exc:
        print(f"bench_manifest: cannot use --dir {base}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    need = (args.size_mb * 1024 + args.small_count * args.small_kb) * 1024 + (256 << 20)
    free = shutil.disk_usage(base).free
    if free < need:
        print(f"bench_manifest: {base} has {free >> 20} MiB free, needs {need >> 20} MiB; lower --size-mb "
              "or --small-count", file=sys.stderr)
        return 2

    work = tempfile.mkdtemp(prefix="rgt-bench-", dir=base)
    results = {}
    try:
        big_dir, small_dir = os.path.join(work, "big"), os.path.join(work, "small")
        os.makedirs(big_dir)
        os.makedirs(small_dir)
        big = os.path.join(big_dir, "model.bin")
        print(f"creating {args.size_mb} MiB file and {args.small_count} x {args.small_kb} KiB files in {work} ...",
              file=sys.stderr)
        write_random(big, args.size_mb << 20)
        small_files = []
        blob = os.urandom(args.small_kb * 1024)
        for i in range(args.small_count):
            path = os.path.join(small_dir, f"d{i // 500:02d}", f"part-{i:05d}.bin")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as handle:
                handle.write(i.to_bytes(8, "little") + blob[8:])
            small_files.append(path)
        warm([big] + small_files)
        big_bytes = args.size_mb << 20
        small_bytes = args.small_count * args.small_kb * 1024
        out = os.path.join(work, "manifest.json")
        py = sys.executable

        def builder(root, roster, buffer_mb):
            return [py, BUILD, "--root", root, "--roster", roster, "--run-id", "bench", "--out", out,
                    "--jobs", str(args.jobs), "--buffer-mb", str(buffer_mb)]

        results["sha256sum large"] = (best_of(args.repeat, [sha256sum, big]), big_bytes)
        for buffer_mb in buffers:
            results[f"manifest large, {buffer_mb:g} MiB buffer"] = (
                best_of(args.repeat, builder(big_dir, "model.bin", buffer_mb)), big_bytes)
        large_manifest = os.path.join(work, "large.json")
        subprocess.run(builder(big_dir, "model.bin", 1), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        os.replace(out, large_manifest)
        results["verify large"] = (best_of(args.repeat, [py, "-c", VERIFY_SNIPPET, LAPTOP, large_manifest, big_dir,
                                                          str(args.jobs)]), big_bytes)

        loop = 'for f in "$@"; do sha256sum "$f"; done'
        results["sha256sum small, one process per file"] = (
            best_of(1, [bash, "-c", loop, "bench"] + small_files), small_bytes)
        results["sha256sum small, all in one call"] = (best_of(args.repeat, [sha256sum] + small_files), small_bytes)
        for buffer_mb in buffers:
            results[f"manifest small, {buffer_mb:g} MiB buffer"] = (
                best_of(args.repeat, builder(small_dir, "**", buffer_mb)), small_bytes)
        small_manifest = os.path.join(work, "small.json")
        subprocess.run(builder(small_dir, "**", 1), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        os.replace(out, small_manifest)
        results["verify small"] = (best_of(args.repeat, [py, "-c", VERIFY_SNIPPET, LAPTOP, small_manifest, small_dir,
                                                          str(args.jobs)]), small_bytes)
    except RuntimeError as exc:
        print(f"bench_manifest: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"data kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    def rate(name):
        seconds, size = results[name]
        return size / seconds

    base_large = rate("sha256sum large")
    base_loop = rate("sha256sum small, one process per file")
    base_one = rate("sha256sum small, all in one call")
    rows, checks = [], []
    for name, (seconds, size) in results.items():
        baseline = base_large if "large" in name else base_loop
        rows.append({"name": name, "seconds": round(seconds, 3), "mib_per_s": round(size / seconds / 2**20, 1),
                     "vs_sha256sum": round(size / seconds / baseline, 2),
                     "vs_sha256sum_one_call": None if "large" in name else round(size / seconds / base_one, 2)})
    best_large = max(rate(n) for n in results if n.startswith("manifest large"))
    best_small = max(rate(n) for n in results if n.startswith("manifest small"))
    checks.append(("manifest large >= 0.9x sha256sum", best_large / base_large, best_large >= 0.9 * base_large))
    checks.append(("verify large >= 0.9x sha256sum", rate("verify large") / base_large,
                   rate("verify large") >= 0.9 * base_large))
    checks.append(("manifest small > sha256sum per-file loop", best_small / base_loop, best_small > base_loop))
    checks.append(("verify small > sha256sum per-file loop", rate("verify small") / base_loop,
                   rate("verify small") > base_loop))
    ok = all(passed for _, _, passed in checks)
    if args.json:
        print(json.dumps({"ok": ok, "jobs": args.jobs, "cpus": os.cpu_count(), "size_mb": args.size_mb,
                          "small_count": args.small_count, "small_kb": args.small_kb, "rows": rows,
                          "targets": [{"target": t, "ratio": round(r, 2), "met": m} for t, r, m in checks]},
                         indent=2))
    else:
        print(f"{os.cpu_count()} CPUs, --jobs {args.jobs}; large: 1 x {args.size_mb} MiB; small: "
              f"{args.small_count} x {args.small_kb} KiB; best of {args.repeat}, warm cache")
        print(f"{'what':44} {'seconds':>8} {'MiB/s':>9} {'x sha256sum':>12} {'x one call':>11}")
        for row in rows:
            one = "" if row["vs_sha256sum_one_call"] is None else f"{row['vs_sha256sum_one_call']:.2f}"
            print(f"{row['name']:44} {row['seconds']:8.3f} {row['mib_per_s']:9.1f} {row['vs_sha256sum']:12.2f} "
                  f"{one:>11}")
        for target, ratio, met in checks:
            print(f"{'MET ' if met else 'MISS'} {target}: {ratio:.2f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
