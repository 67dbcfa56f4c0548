#!/usr/bin/env python3
"""Says whether a checkpoint loads and which full-state parts a resume from it would miss (optimizer, step, RNG).

Node-side: Python 3.8+ and the standard library; uses PyTorch when it imports.

Usage:
  python3 ckpt_inspect.py PATH [--json] [--require KEY ...]

  PATH           checkpoint file (torch.save zip or legacy, .safetensors, plain pickle) or a
                 torch.distributed.checkpoint folder
  --json         print one JSON object instead of text
  --require KEY  exit 1 unless the checkpoint holds KEY; repeatable. KEY: model optimizer scheduler scaler rng
                 step epoch data, or full (= model optimizer scheduler rng step data)

Without torch only the container is checked: zip central directory and data.pkl ending in the pickle STOP
opcode; safetensors header parses and its offsets match the file size; pickle ends in STOP; a DCP folder has
its .metadata (dcp.save writes it last). With torch: torch.load(weights_only=True), then again with numpy's
RNG-state classes allow-listed; never weights_only=False (it says when only that would load: do it yourself,
for a file you trust). Parts it cannot see count as missing. As the teardown gate's load check:
  teardown_gate.py ... --load-check "python3 scripts/node/ckpt_inspect.py {} --require model"

Exit codes: 0 readable and every --require part present; 1 a check failed (empty, truncated, corrupt, unknown
layout, required part missing); 2 bad usage (one line on stderr); 3 refused: the node folder around it is not
one version (the shared core's check; a copy of this file on its own skips it).
"""
import contextlib
import json
import os
import pickle
import pickletools
import re
import struct
import sys
import zipfile

import rgt_core as core  # the node folder's shared core (errors, exit codes, version check)

PARTS = ("model", "optimizer", "scheduler", "scaler", "rng", "step", "epoch", "data")
FULL = ("model", "optimizer", "scheduler", "rng", "step", "data")
RULES = (("optimizer", ("optim",)), ("scheduler", ("sched",)), ("scaler", ("scaler", "amp")),
         ("rng", ("rng", "random")), ("epoch", ("epoch",)), ("step", ("step", "iter", "updates")),
         ("data", ("data", "sampler", "consumed", "loops", "position")), ("model", ("model", "net", "module")))
NOT_STATE = {"total", "per", "max", "num", "size", "config", "cfg", "args", "metadata"}  # settings, not state
LEGACY_MAGIC = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19."  # first pickle of torch.save(..., zipfile off)
SMALL = 64 << 20  # pickles below this size are walked opcode by opcode; larger ones are checked for a final STOP


def classify(key):
    words = set(w for w in re.split(r"[^a-z0-9]+", str(key).lower()) if w)
    if str(key) in ("state_dict", "batch_idx"):
        return "model" if key == "state_dict" else "data"
    if words & NOT_STATE:
        return None
    return next((part for part, stems in RULES if any(w.startswith(s) for w in words for s in stems)), None)


def pickle_bad(fh, size):
    """None when the pickle stream is whole, else why not (never unpickles)."""
    if size >= SMALL:
        fh.seek(-1, os.SEEK_END)
        return None if fh.read(1) == b"." else "pickle does not end with the STOP opcode (truncated)"
    try:
        if any(op.name == "STOP" for op, _, _ in pickletools.genops(fh)):
            return None
    except Exception as exc:
        return "pickle stream is cut short (%s)" % exc
    return "pickle stream has no STOP opcode"


def check_file(path, rep):
    """Container check; sets rep format/size; returns a problem or None."""
    size = rep["size_bytes"] = os.path.getsize(path)
    if size == 0:
        return "empty file (0 bytes): a save that never wrote, or a copy that failed"
    with open(path, "rb") as fh:
        head = fh.read(8)
        if head[:4] == b"PK\x03\x04":
            rep["format"] = "torch zip"
            try:
                with zipfile.ZipFile(path) as zf:
                    names = zf.namelist()
                    rep["entries"] = len(names)
                    pkl = [n for n in names if n.endswith("data.pkl")]
                    if not pkl:
                        return "zip without data.pkl: not a torch.save archive"
                    with zf.open(pkl[0]) as inner:
                        return pickle_bad(inner, zf.getinfo(pkl[0]).file_size)
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                return ("truncated or corrupt zip (%s); torch says 'PytorchStreamReader failed reading zip "
                        "archive: failed finding central directory'" % exc)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else size
        if n < min(size, 100 << 20) and fh.read(1) == b"{":
            rep["format"] = "safetensors"
            fh.seek(8)
            try:
                tensors = {k: v for k, v in json.loads(fh.read(n).decode("utf-8")).items() if k != "__metadata__"}
                end = max([v["data_offsets"][1] for v in tensors.values()] or [0])
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                return "safetensors header does not parse (%s)" % exc
            rep["entries"], rep["parts"]["model"], rep["parts_known"] = len(tensors), bool(tensors), True
            if 8 + n + end != size:
                return "safetensors data is %d bytes, its header says %d (truncated)" % (size - 8 - n, end)
            return None
        if head[:1] == b"\x80":
            fh.seek(0)
            if fh.read(len(LEGACY_MAGIC)) == LEGACY_MAGIC:
                rep["format"] = "torch legacy"  # header pickles, then raw storages: torch.load checks the rest
                return None
            rep["format"] = "pickle"
            fh.seek(0)
            return pickle_bad(fh, size)
    return "unknown format (not a torch zip, safetensors or pickle)"


def describe(obj, rep):
    """Fill rep['parts'] from a loaded checkpoint's top-level keys."""
    import torch
    rep["parts_known"] = True
    if not isinstance(obj, dict):
        rep["notes"].append("top level is a %s, not a dict: parts unknown" % type(obj).__name__)
        return
    if obj and all(torch.is_tensor(v) for v in obj.values()):
        rep["parts"]["model"] = True
        rep["notes"].append("a bare state_dict: weights only")
        return
    for key, value in obj.items():
        part = classify(key)
        if part is None:
            rep["other_keys"].append(str(key))
            continue
        rep["parts"][part] = True
        if part in ("step", "epoch") and isinstance(value, int):
            rep[part] = value
        if part == "rng" and isinstance(value, dict):
            rep["rng"] = sorted(str(k) for k in value)
        if part == "optimizer" and isinstance(value, dict) and value.get("state") == {}:
            rep["notes"].append("optimizer state is empty: saved before the first step, moments start cold")
        if part == "scaler" and isinstance(value, dict) and not (value.get("state", value) or {}):
            rep["notes"].append("scaler state is empty (scaler disabled: fine for bf16 or fp32)")


def torch_load(path, rep):
    try:
        import torch
    except ImportError:
        rep["notes"].append("torch not importable: container checked, parts not listed")
        return
    try:  # what np.random.get_state() pickles to: an ndarray of uint32
        import numpy as np
        core = getattr(np, "_core", None) or np.core
        allow = [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    except ImportError:
        allow = []
    kwargs = dict(map_location="cpu", weights_only=True, mmap=rep["format"] == "torch zip")
    allowing = getattr(torch.serialization, "safe_globals", None)  # torch 2.5+
    for label, extra in (("weights_only=True", []), ("weights_only=True + numpy allow-list", allow)):
        if extra is allow and not (allow and allowing):
            break
        try:
            with allowing(extra) if extra else contextlib.nullcontext():
                obj = torch.load(path, **kwargs)
        except pickle.UnpicklingError:
            continue
        except Exception as exc:
            rep["problems"].append("torch.load failed: %s: %s" % (type(exc).__name__, str(exc)[:200]))
            return
        rep["loaded_with"] = label
        describe(obj, rep)
        if not rep["parts"]["scaler"]:
            rep["notes"].append("no GradScaler state: a resume needs one only for fp16 training")
        return
    rep["needs_trusted_load"] = True
    rep["notes"].append("loads only with weights_only=False, which runs the pickle's code: do that yourself and "
                        "only for a file you trust, or allow-list its classes (torch.serialization.safe_globals)")


def dcp_keys(path):
    """Top-level keys of a DCP checkpoint, read through an unpickler that builds only DCP metadata types."""
    import torch

    class Restricted(pickle.Unpickler):
        def find_class(self, module, name):
            if module.startswith("torch.distributed.checkpoint.") or (module, name) in (
                    ("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath")) or (
                    module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
                return super().find_class(module, name)
            raise pickle.UnpicklingError("global %s.%s is not allowed" % (module, name))

    with open(os.path.join(path, ".metadata"), "rb") as fh:
        return {k.split(".")[0]: None for k in Restricted(fh).load().state_dict_metadata}


def check_dir(path, rep):
    names = os.listdir(path)
    rep["size_bytes"] = sum(os.path.getsize(os.path.join(path, n)) for n in names
                            if os.path.isfile(os.path.join(path, n)))
    if ".metadata" in names or any(n.endswith(".distcp") for n in names):
        rep["format"], rep["entries"] = "torch.distributed.checkpoint", sum(n.endswith(".distcp") for n in names)
        meta = os.path.join(path, ".metadata")
        if not os.path.isfile(meta) or os.path.getsize(meta) == 0:
            return "no .metadata: dcp.save writes it last, so this save did not finish"
        with open(meta, "rb") as fh:
            bad = pickle_bad(fh, os.path.getsize(meta))
        if bad:
            return ".metadata: " + bad
        try:
            describe(dcp_keys(path), rep)
        except ImportError:
            rep["notes"].append("torch not importable: shards checked, parts not listed")
        except Exception as exc:
            return ".metadata unreadable: %s" % exc
        return None
    return "not a known checkpoint folder: expected torch.distributed.checkpoint (.metadata + *.distcp); " \
           "check the files of an HF Trainer or Accelerate folder one by one"


def inspect(path):
    """Inspect one checkpoint file or folder; return a dict with status OK or FAIL and what it holds."""
    rep = {"path": path, "status": "OK", "format": None, "size_bytes": None, "entries": None,
           "parts": dict.fromkeys(PARTS, False), "step": None, "epoch": None, "rng": None, "loaded_with": None,
           "needs_trusted_load": False, "corrupt": False, "parts_known": False, "other_keys": [], "notes": [],
           "problems": []}
    try:
        bad = check_dir(path, rep) if os.path.isdir(path) else check_file(path, rep)
        if not bad and rep["format"] in ("torch zip", "torch legacy"):
            torch_load(path, rep)
        elif not bad and rep["format"] == "pickle":
            rep["notes"].append("plain pickle: structure checked, not unpickled (that would run its code)")
    except (OSError, ValueError) as exc:
        bad = "cannot read: %s" % exc
    if bad:
        rep["problems"].append(bad)
        rep["corrupt"] = True  # the container itself is damaged, not just incomplete
    rep["missing_for_resume"] = [p for p in FULL if not rep["parts"][p]]
    rep["status"] = "FAIL" if rep["problems"] else "OK"
    return rep


def main(argv=None):
    core.check_toolkit()
    parser = core.Parser(prog="ckpt_inspect.py", description=__doc__.splitlines()[0], formatter_class=core.RawHelp,
                         epilog=core.exit_codes_epilog(__doc__))
    parser.add_argument("path", help="checkpoint file or folder")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--require", action="append", default=[], metavar="KEY",
                        help="exit 1 unless this part is present: %s, or full" % " ".join(PARTS))
    args = parser.parse_args(argv)
    for key in args.require:
        if key not in PARTS + ("full",):
            raise core.UsageError("--require %s: not one of %s full" % (key, " ".join(PARTS)))
    if not os.path.exists(args.path):
        raise core.UsageError("no such file or directory: %s" % args.path)
    rep = inspect(args.path)
    wanted = [p for k in args.require for p in (FULL if k == "full" else (k,))]
    absent = [p for p in dict.fromkeys(wanted) if not rep["parts"][p]]
    if absent and rep["status"] == "OK":
        rep["status"] = "FAIL"
        rep["problems"].append("required but not found: %s" % " ".join(absent))
    if args.json:
        core.emit_json(rep)
        return 0 if rep["status"] == "OK" else 1
    print("%-4s %s (%s, %s bytes)" % (rep["status"], args.path, rep["format"] or "unknown", rep["size_bytes"]))
    if not rep["parts_known"] and not rep["corrupt"]:
        print("     holds: not listed (see note)")
    elif not rep["corrupt"]:
        held = [p + ("=%s" % rep[p] if p in ("step", "epoch") and rep[p] is not None else "")
                for p in PARTS if rep["parts"][p]]
        print("     holds: %s%s" % (" ".join(held) or "nothing recognised",
                                   " (rng: %s)" % " ".join(rep["rng"]) if rep["rng"] else ""))
        print("     a full-state resume would miss: %s" % (" ".join(rep["missing_for_resume"]) or "nothing"))
    for kind in ("note", "problem"):
        print("".join("     %s: %s\n" % (kind, line) for line in rep[kind + "s"]), end="")
    if rep["corrupt"]:
        print("     fix: resume from the previous good generation on durable storage; save atomically "
              "(temp file, fsync, os.replace)")
    elif absent:
        print("     fix: save the missing parts in the checkpoint dict, then test a kill-and-resume")
    return 0 if rep["status"] == "OK" else 1


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="ckpt_inspect.py"))
