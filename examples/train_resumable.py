#!/usr/bin/env python3
"""A small training job that survives being killed: full-state checkpoints, atomic writes,
automatic resume, a clean save on SIGTERM, and a heartbeat a watchdog can read.

Copy its habits into your own training loop; the model itself (a tiny regression on synthetic
data) is only there so the habits can be tested on a laptop in seconds.

Usage:
  python3 examples/train_resumable.py --ckpt-dir DIR --steps N [--step-seconds S]
      [--ckpt-every K] [--keep K] [--seed S] [--backend auto|torch|pure]
      [--heartbeat FILE] [--heartbeat-every K] [--batch-size B] [--samples N] [--lr LR]

  Launch the identical command again after any interruption: it always resumes from the newest
  readable checkpoint in --ckpt-dir (there is no --resume flag to forget).

Backends:
  torch  PyTorch MLP (dropout) + AdamW + cosine LR schedule + GradScaler. Mixed precision and an
         enabled scaler only on CUDA; on CPU the scaler is disabled, and its (empty) state is still
         saved and restored so the checkpoint layout is the same everywhere. Bit-for-bit resume is
         tested on CPU; on GPU some kernels are not deterministic.
  pure   Python-only linear regression by SGD with momentum (no third-party packages).
  auto   torch when it imports, else pure. With checkpoints already present, the backend that
         wrote them.

What a checkpoint holds (ckpt-<step, 8 digits>.pt for torch, .json for pure):
  model, optimizer and LR-scheduler state, GradScaler state (with its enabled flag), step, epoch,
  position inside the epoch's data order, RNG states (Python random; NumPy when installed; torch
  CPU; every CUDA device when present) and the run config. The data order of each epoch is a
  seeded shuffle of (seed, epoch), so step + epoch + position pin the next batch exactly.

Files written in --ckpt-dir:
  ckpt-XXXXXXXX.pt|json  written to a temp file in the same directory, flushed, fsynced, renamed
                         with os.replace, then the directory is fsynced. The newest --keep (2) are
                         kept; older ones are deleted only after the new one is durable.
  *.corrupt              a checkpoint that failed to load is renamed aside, never deleted.
  metrics.jsonl          one JSON line per step {step, epoch, loss, lr, time}; on resume, lines past
                         the checkpoint are dropped and recomputed, so steps stay unique and contiguous.
  final.json             {steps_done, total_steps, loss, eval_loss, backend, resumed_from,
                          params_sha256, seed, finished_at, model_file}
  model_final.pt|json    the final weights only (for inference; not a resume point).

Resolving "latest": the highest-numbered ckpt-* file that loads and passes checks. Temp files
(.ckpt-*.tmp) left by a kill mid-write are ignored and removed at start; a newest checkpoint that
is truncated or unreadable is moved aside and the previous one is used. If checkpoints exist but
none loads, the script stops (exit 1) instead of silently restarting from step 0.

Heartbeat (to --heartbeat FILE, else $RGT_HEARTBEAT, else none): atomic JSON
  {step, total_steps, epoch, loss, time (unix float), sec_per_step}
  written at start, every --heartbeat-every steps, and when stopping.

Signals: SIGTERM (and SIGINT, SIGHUP unless they are ignored, e.g. under nohup) set a flag; the
current step finishes, a checkpoint is saved (milliseconds for this model) and the script exits
with 128 + the signal number: 143 for SIGTERM, 130 for SIGINT, 129 for SIGHUP. Further signals
during the save are ignored; use kill -9 to abort (the previous checkpoint stays intact).

Exit codes:
  0    training finished (also when it was already finished: the run is idempotent)
  1    checkpoints exist but none can be loaded; or an unexpected error
  2    usage error, or --ckpt-dir holds checkpoints from another backend or config
  129/130/143  stopped by SIGHUP/SIGINT/SIGTERM after saving a checkpoint
"""
import argparse
import hashlib
import json
import math
import os
import random
import re
import signal
import struct
import sys
import tempfile
import time

FORMAT = "rgt-train-ckpt/1"
CKPT_RE = re.compile(r"^ckpt-(\d{8})\.(pt|json)$")
EXT = {"torch": "pt", "pure": "json"}
N_FEATURES = 4


class Incompatible(Exception):
    """The checkpoint directory belongs to a different backend or configuration."""


class Unreadable(Exception):
    """A checkpoint file exists but cannot be used (truncated, corrupt, wrong contents)."""


def log(msg):
    sys.stderr.write("[train] %s\n" % msg)
    sys.stderr.flush()


def utc_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------- durable file helpers

def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


def atomic_write(path, write, durable=True):
    """Write via a temp file in the target's own directory, then os.replace it into place.

    A kill at any moment leaves either the old file or the new one, never a half-written one.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(directory)


def write_json(path, obj, durable=True):
    data = (json.dumps(obj, sort_keys=True) + "\n").encode()
    atomic_write(path, lambda fh: fh.write(data), durable=durable)


# ---------------------------------------------------------------- data shared by both backends

def make_dataset(seed, n):
    """Synthetic regression data from its own RNG, so it never depends on the training RNG."""
    rng = random.Random(seed * 7919 + 17)
    true_w = [rng.uniform(-2.0, 2.0) for _ in range(N_FEATURES)]
    xs, ys = [], []
    for _ in range(n):
        x = [rng.gauss(0.0, 1.0) for _ in range(N_FEATURES)]
        y = sum(w * v for w, v in zip(true_w, x)) + 0.3 * math.sin(2.0 * x[0]) + 0.5
        xs.append(x)
        ys.append(y)
    return xs, ys


def epoch_order(seed, epoch, n):
    """The sample order of one epoch: a shuffle seeded by (seed, epoch), different every epoch."""
    order = list(range(n))
    random.Random(seed * 1000003 + epoch).shuffle(order)
    return order


def target_noise(count):
    """Per-step label jitter drawn from the global Python RNG (so its state must be checkpointed)."""
    return [random.gauss(0.0, 0.01) for _ in range(count)]


def cosine_lr(base, floor, done, total):
    return floor + 0.5 * (base - floor) * (1.0 + math.cos(math.pi * min(done, total) / max(total, 1)))


# ---------------------------------------------------------------- RNG state (backend-neutral part)

def numpy_module():
    try:
        import numpy  # noqa: F401  (optional; only its global RNG state is saved)
        return numpy
    except ImportError:
        return None


def capture_common_rng():
    version, internal, gauss_next = random.getstate()
    state = {"python": [version, list(internal), gauss_next], "numpy": None}
    np = numpy_module()
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    return state


def restore_common_rng(state):
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    np = numpy_module()
    if np is not None and state.get("numpy") is not None:
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def seed_everything(seed):
    random.seed(seed)
    np = numpy_module()
    if np is not None:
        np.random.seed(seed % (2 ** 32))


# ---------------------------------------------------------------- pure-Python backend

class PureTrainer:
    name = "pure"
    ext = "json"

    def __init__(self, cfg):
        self.cfg = cfg
        seed_everything(cfg["seed"])
        self.xs, self.ys = make_dataset(cfg["seed"], cfg["samples"])
        init = random.Random(cfg["seed"] + 1)
        self.w = [init.uniform(-0.1, 0.1) for _ in range(N_FEATURES)]
        self.b = 0.0
        self.momentum = 0.9
        self.vel_w = [0.0] * N_FEATURES
        self.vel_b = 0.0
        self.sched_done = 0          # scheduler position: optimizer steps taken
        self.lr = cosine_lr(cfg["lr"], cfg["lr"] * 0.1, 0, cfg["steps"])

    def train_step(self, idx):
        noise = target_noise(len(idx))
        gw = [0.0] * N_FEATURES
        gb = 0.0
        loss = 0.0
        for j, i in enumerate(idx):
            x = self.xs[i]
            err = sum(w * v for w, v in zip(self.w, x)) + self.b - (self.ys[i] + noise[j])
            loss += err * err
            for k in range(N_FEATURES):
                gw[k] += 2.0 * err * x[k]
            gb += 2.0 * err
        n = float(len(idx))
        lr = self.lr
        for k in range(N_FEATURES):
            self.vel_w[k] = self.momentum * self.vel_w[k] + gw[k] / n
            self.w[k] -= lr * self.vel_w[k]
        self.vel_b = self.momentum * self.vel_b + gb / n
        self.b -= lr * self.vel_b
        self.sched_done += 1
        self.lr = cosine_lr(self.cfg["lr"], self.cfg["lr"] * 0.1, self.sched_done, self.cfg["steps"])
        return loss / n, lr

    def eval_loss(self):
        total = 0.0
        for x, y in zip(self.xs, self.ys):
            err = sum(w * v for w, v in zip(self.w, x)) + self.b - y
            total += err * err
        return total / len(self.xs)

    def state(self):
        return {
            "model": {"w": list(self.w), "b": self.b},
            "optimizer": {"kind": "sgd-momentum", "momentum": self.momentum,
                          "vel_w": list(self.vel_w), "vel_b": self.vel_b},
            "scheduler": {"kind": "cosine", "done": self.sched_done, "lr": self.lr},
            "scaler": {"enabled": False, "state": {}},   # no mixed precision in pure Python
            "rng_backend": {},
        }

    def load(self, st):
        self.w = [float(v) for v in st["model"]["w"]]
        self.b = float(st["model"]["b"])
        self.vel_w = [float(v) for v in st["optimizer"]["vel_w"]]
        self.vel_b = float(st["optimizer"]["vel_b"])
        self.momentum = float(st["optimizer"]["momentum"])
        self.sched_done = int(st["scheduler"]["done"])
        self.lr = float(st["scheduler"]["lr"])
        if len(self.w) != N_FEATURES or len(self.vel_w) != N_FEATURES:
            raise Unreadable("model has the wrong shape")

    def capture_backend_rng(self):
        return {}

    def restore_backend_rng(self, _state):
        pass

    def serialize(self, payload, fh):
        fh.write(json.dumps(payload, sort_keys=True).encode())

    def deserialize(self, path):
        with open(path, "rb") as fh:
            return json.loads(fh.read().decode())

    def params_sha256(self):
        h = hashlib.sha256()
        for v in self.w + [self.b]:
            h.update(struct.pack("<d", v))
        return h.hexdigest()

    def export(self, path):
        write_json(path, {"kind": "linear", "w": self.w, "b": self.b})


# ---------------------------------------------------------------- PyTorch backend

class TorchTrainer:
    name = "torch"
    ext = "pt"

    def __init__(self, cfg):
        import torch  # lazy: --help and the pure backend never pay for this import
        from torch import nn
        self.torch = torch
        self.cfg = cfg
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        seed_everything(cfg["seed"])
        torch.manual_seed(cfg["seed"])          # also seeds every CUDA device
        xs, ys = make_dataset(cfg["seed"], cfg["samples"])
        self.x = torch.tensor(xs, dtype=torch.float32, device=self.device)
        self.y = torch.tensor(ys, dtype=torch.float32, device=self.device).unsqueeze(1)
        self.model = nn.Sequential(
            nn.Linear(N_FEATURES, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, 1)
        ).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg["lr"], weight_decay=0.01)
        self.sched = torch.optim.lr_scheduler.CosineAnnealingLR(
            self.opt, T_max=max(cfg["steps"], 1), eta_min=cfg["lr"] * 0.1)
        self.use_amp = self.device.type == "cuda"
        self.scaler = self._make_scaler(self.use_amp)

    def _make_scaler(self, enabled):
        torch = self.torch
        amp = getattr(torch, "amp", None)
        if amp is not None and hasattr(amp, "GradScaler"):
            return amp.GradScaler(self.device.type, enabled=enabled)
        return torch.cuda.amp.GradScaler(enabled=enabled)   # older PyTorch

    def train_step(self, idx):
        torch = self.torch
        noise = torch.tensor(target_noise(len(idx)), dtype=torch.float32, device=self.device).unsqueeze(1)
        index = torch.tensor(idx, dtype=torch.long, device=self.device)
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=self.device.type, dtype=torch.float16, enabled=self.use_amp):
            pred = self.model(self.x[index])
            loss = torch.nn.functional.mse_loss(pred.float(), self.y[index] + noise)
        lr = self.opt.param_groups[0]["lr"]
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()        # scaler state is read for the checkpoint only after this
        self.sched.step()
        return float(loss.detach().cpu()), lr

    def eval_loss(self):
        torch = self.torch
        self.model.eval()
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(self.model(self.x), self.y).cpu())

    def state(self):
        return {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "scaler": {"enabled": self.scaler.is_enabled(), "state": self.scaler.state_dict()},
        }

    def load(self, st):
        self.model.load_state_dict(st["model"], strict=True)
        self.opt.load_state_dict(st["optimizer"])
        self.sched.load_state_dict(st["scheduler"])
        saved = st["scaler"]
        if self.scaler.is_enabled() and saved.get("enabled") and saved.get("state"):
            self.scaler.load_state_dict(saved["state"])
        elif self.scaler.is_enabled():
            log("checkpoint has no enabled GradScaler state (saved on CPU?): starting a fresh scaler")

    def capture_backend_rng(self):
        torch = self.torch
        out = {"torch_cpu": torch.get_rng_state(), "torch_cuda": None}
        if torch.cuda.is_available():
            out["torch_cuda"] = torch.cuda.get_rng_state_all()
        return out

    def restore_backend_rng(self, st):
        torch = self.torch
        torch.set_rng_state(st["torch_cpu"])
        cuda = st.get("torch_cuda")
        if cuda and torch.cuda.is_available():
            if len(cuda) != torch.cuda.device_count():
                log("checkpoint saved CUDA RNG for %d device(s), this box has %d"
                    % (len(cuda), torch.cuda.device_count()))
            for dev, rng_state in enumerate(cuda[:torch.cuda.device_count()]):
                torch.cuda.set_rng_state(rng_state, dev)

    def serialize(self, payload, fh):
        self.torch.save(payload, fh)

    def deserialize(self, path):
        # weights_only=True: loading a checkpoint must never run code hidden in a pickle.
        return self.torch.load(path, map_location="cpu", weights_only=True)

    def params_sha256(self):
        h = hashlib.sha256()
        for name, t in sorted(self.model.state_dict().items()):
            t = t.detach().cpu().contiguous()
            h.update(name.encode() + str(t.dtype).encode() + str(tuple(t.shape)).encode())
            h.update(bytes(t.reshape(-1).view(self.torch.uint8).tolist()))
        return h.hexdigest()

    def export(self, path):
        sd = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        atomic_write(path, lambda fh: self.torch.save(sd, fh))


# ---------------------------------------------------------------- checkpoint directory

def list_checkpoints(ckpt_dir):
    """[(step, ext, path)] newest first; temp files and quarantined files never match."""
    found = []
    for name in os.listdir(ckpt_dir):
        m = CKPT_RE.match(name)
        if m:
            found.append((int(m.group(1)), m.group(2), os.path.join(ckpt_dir, name)))
    found.sort(reverse=True)
    return found


def remove_stale_temps(ckpt_dir):
    for name in os.listdir(ckpt_dir):
        if name.startswith((".ckpt-", ".metrics.jsonl.", ".final.json.", ".model_final.")) and name.endswith(".tmp"):
            try:
                os.unlink(os.path.join(ckpt_dir, name))
                log("removed partial temp file %s (left by an interrupted write)" % name)
            except OSError:
                pass


def check_payload(payload, step, trainer, cfg):
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise Unreadable("not a %s checkpoint" % FORMAT)
    for key in ("step", "epoch", "config", "model", "optimizer", "scheduler", "scaler", "rng", "data"):
        if key not in payload:
            raise Unreadable("missing key %r" % key)
    if payload["step"] != step:
        raise Unreadable("file name says step %d, contents say %s" % (step, payload["step"]))
    if payload.get("backend") != trainer.name:
        raise Incompatible("checkpoint backend %s, running %s" % (payload.get("backend"), trainer.name))
    if payload["config"] != cfg:
        diff = sorted(k for k in set(cfg) | set(payload["config"]) if cfg.get(k) != payload["config"].get(k))
        raise Incompatible("config differs from the checkpoint's in %s (saved %s)"
                           % (", ".join(diff), {k: payload["config"].get(k) for k in diff}))


def quarantine(path, why):
    dest = path + ".corrupt"
    n = 1
    while os.path.exists(dest):
        n += 1
        dest = "%s.corrupt%d" % (path, n)
    os.replace(path, dest)
    log("checkpoint %s is unusable (%s): moved to %s" % (os.path.basename(path), why, os.path.basename(dest)))


def load_latest(ckpt_dir, trainer, cfg):
    """Restore the newest usable checkpoint into trainer; return its payload or None."""
    tried = 0
    for step, ext, path in list_checkpoints(ckpt_dir):
        if ext != trainer.ext:
            raise Incompatible("%s was written by the %s backend" % (os.path.basename(path),
                                                                    "torch" if ext == "pt" else "pure"))
        tried += 1
        try:
            payload = trainer.deserialize(path)
            check_payload(payload, step, trainer, cfg)
            trainer.load(payload)
        except (Incompatible, MemoryError):
            raise     # not the file's fault: never move a possibly good checkpoint aside for these
        except Exception as exc:  # truncated zip, bad JSON, wrong shapes: all mean "not usable"
            quarantine(path, "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0][:160] if str(exc) else ""))
            continue
        restore_common_rng(payload["rng"])
        trainer.restore_backend_rng(payload["rng"])
        return payload
    if tried:
        raise Unreadable("%d checkpoint(s) in %s and none loads (moved aside as *.corrupt); refusing to "
                         "restart from step 0 silently. Move them away to start fresh." % (tried, ckpt_dir))
    return None


def save_checkpoint(ckpt_dir, trainer, cfg, step, steps_per_epoch, last_loss, keep):
    epoch, position = divmod(step, steps_per_epoch)
    rng = capture_common_rng()
    rng.update(trainer.capture_backend_rng())
    payload = {
        "format": FORMAT, "backend": trainer.name, "step": step, "epoch": epoch,
        "total_steps": cfg["steps"], "config": dict(cfg), "rng": rng, "last_loss": last_loss,
        "data": {"epoch": epoch, "position": position, "steps_per_epoch": steps_per_epoch,
                 "order": "shuffle of range(samples) seeded with seed*1000003+epoch"},
        "saved_at": utc_now(),
    }
    payload.update(trainer.state())
    path = os.path.join(ckpt_dir, "ckpt-%08d.%s" % (step, trainer.ext))
    atomic_write(path, lambda fh: trainer.serialize(payload, fh))
    for _s, _e, old in list_checkpoints(ckpt_dir)[keep:]:   # prune only after the new one is durable
        try:
            os.unlink(old)
        except OSError:
            pass
    return path


# ---------------------------------------------------------------- metrics

class Metrics:
    def __init__(self, path):
        self.path = path
        self.fh = None

    def truncate_after(self, step):
        """Keep one line per step <= step (the ones the checkpoint covers); later steps get redone."""
        kept = {}
        if os.path.exists(self.path):
            with open(self.path, "rb") as fh:
                for raw in fh:
                    try:
                        rec = json.loads(raw.decode())
                        s = int(rec["step"])
                    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                        continue   # a line cut short by a kill
                    if 1 <= s <= step and s not in kept:
                        kept[s] = rec
        lines = "".join(json.dumps(kept[s], sort_keys=True) + "\n" for s in sorted(kept))
        atomic_write(self.path, lambda fh: fh.write(lines.encode()))
        return len(kept)

    def append(self, rec):
        if self.fh is None:
            self.fh = open(self.path, "a")
        self.fh.write(json.dumps(rec, sort_keys=True) + "\n")
        self.fh.flush()

    def sync(self):
        if self.fh is not None:
            self.fh.flush()
            os.fsync(self.fh.fileno())

    def close(self):
        if self.fh is not None:
            self.fh.close()
            self.fh = None


# ---------------------------------------------------------------- signals

class StopFlag:
    def __init__(self):
        self.signum = None
        self.at = None

    def handler(self, signum, _frame):
        if self.signum is None:       # first signal wins; later ones are ignored while we save
            self.signum = signum
            self.at = time.time()

    def install(self):
        signal.signal(signal.SIGTERM, self.handler)
        for name in ("SIGINT", "SIGHUP"):
            sig = getattr(signal, name, None)
            if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, self.handler)


# ---------------------------------------------------------------- main

class Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr (exit 2), not the whole usage block."""
    def error(self, message):
        sys.stderr.write("%s: error: %s (try --help)\n" % (self.prog, message))
        sys.exit(2)


def parse_args(argv):
    p = Parser(
        description="Resumable training example: full-state atomic checkpoints, automatic resume, "
                    "SIGTERM save (exit 143), heartbeat. See the module docstring for files and exit codes.")
    p.add_argument("--ckpt-dir", required=True, help="checkpoints, metrics.jsonl, final.json go here")
    p.add_argument("--steps", type=int, required=True, help="total optimizer steps of the run")
    p.add_argument("--step-seconds", type=float, default=0.0, help="extra sleep per step (simulated work)")
    p.add_argument("--ckpt-every", type=int, default=10, help="checkpoint every K steps (default 10)")
    p.add_argument("--keep", type=int, default=2, help="keep the newest K checkpoints (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=("auto", "torch", "pure"), default="auto")
    p.add_argument("--heartbeat", help="heartbeat JSON file (default: $RGT_HEARTBEAT, else none)")
    p.add_argument("--heartbeat-every", type=int, default=1, help="write the heartbeat every K steps")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--samples", type=int, default=64, help="size of the synthetic data set")
    p.add_argument("--lr", type=float, default=0.01)
    args = p.parse_args(argv)
    for name in ("steps", "ckpt_every", "keep", "heartbeat_every", "batch_size", "samples"):
        if getattr(args, name) < 1:
            p.error("--%s must be >= 1" % name.replace("_", "-"))
    if args.batch_size > args.samples:
        p.error("--batch-size must not exceed --samples")
    if not 0 <= args.step_seconds < 1e6:   # also nan and inf
        p.error("--step-seconds must be >= 0 and < 1e6")
    if not 0 < args.lr < 1e6:
        p.error("--lr must be > 0 and < 1e6")
    if not args.ckpt_dir:
        p.error("--ckpt-dir is empty")
    existing = os.path.abspath(args.ckpt_dir)
    while not os.path.exists(existing):   # the part of --ckpt-dir that is already there
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        p.error("--ckpt-dir %s: %s is not a directory" % (args.ckpt_dir, existing))
    hb_path = args.heartbeat or os.environ.get("RGT_HEARTBEAT")
    if hb_path:
        folder = os.path.dirname(os.path.abspath(hb_path))
        if os.path.isdir(hb_path) or not os.path.isdir(folder):
            p.error("heartbeat file %s cannot be written (%s)" % (
                hb_path, "it is a directory" if os.path.isdir(hb_path) else "no directory " + folder))
    return args


def torch_importable():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def choose_backend(requested, ckpt_dir):
    """auto: the backend that wrote the newest checkpoint, else torch when importable, else pure."""
    existing = list_checkpoints(ckpt_dir)
    on_disk = ("torch" if existing[0][1] == "pt" else "pure") if existing else None
    if requested == "auto":
        return on_disk or ("torch" if torch_importable() else "pure")
    if on_disk and on_disk != requested:   # checked before importing anything heavy
        raise Incompatible("it holds %s checkpoints from the %s backend; use --backend %s or another "
                           "--ckpt-dir" % (os.path.basename(existing[0][2]), on_disk, on_disk))
    return requested


def sleep_unless_stopped(seconds, stop):
    end = time.monotonic() + seconds
    while stop.signum is None:
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


def run(args):
    ckpt_dir = os.path.abspath(args.ckpt_dir)
    os.makedirs(ckpt_dir, exist_ok=True)
    remove_stale_temps(ckpt_dir)
    stop = StopFlag()
    stop.install()   # before the slow import/resume, so an early SIGTERM is not lost

    backend = choose_backend(args.backend, ckpt_dir)
    if backend == "torch" and not torch_importable():
        raise Incompatible("the torch backend needs PyTorch (pip install torch), or use --backend pure")
    cfg = {"seed": args.seed, "lr": args.lr, "batch_size": args.batch_size,
           "samples": args.samples, "steps": args.steps}
    trainer = TorchTrainer(cfg) if backend == "torch" else PureTrainer(cfg)
    steps_per_epoch = args.samples // args.batch_size

    payload = load_latest(ckpt_dir, trainer, cfg)
    start = payload["step"] if payload else 0
    last_loss = payload.get("last_loss") if payload else None
    if payload:
        if payload["data"]["position"] != start % steps_per_epoch:
            raise Unreadable("checkpoint data position disagrees with its step")
        log("resumed from step %d (epoch %d, batch %d of the epoch) with backend %s"
            % (start, payload["epoch"], payload["data"]["position"], backend))
    else:
        log("no checkpoint in %s: starting at step 0 with backend %s" % (ckpt_dir, backend))
    del payload
    device = getattr(trainer, "device", None)
    log("device: %s" % (device if device is not None else "cpu (pure Python)"))

    metrics = Metrics(os.path.join(ckpt_dir, "metrics.jsonl"))
    metrics.truncate_after(start)
    hb_path = args.heartbeat or os.environ.get("RGT_HEARTBEAT") or None
    sec_per_step = None

    def heartbeat(step):
        if hb_path:
            write_json(hb_path, {"step": step, "total_steps": args.steps, "epoch": step // steps_per_epoch,
                                 "loss": last_loss, "time": time.time(), "sec_per_step": sec_per_step},
                       durable=False)

    heartbeat(start)
    step = start
    saved_at = start if start else None
    log_every = max(1, args.steps // 10)
    order, order_epoch = None, None
    while step < args.steps and stop.signum is None:
        t0 = time.monotonic()
        epoch, position = divmod(step, steps_per_epoch)
        if order_epoch != epoch:
            order, order_epoch = epoch_order(args.seed, epoch, args.samples), epoch
        batch = order[position * args.batch_size:(position + 1) * args.batch_size]
        sleep_unless_stopped(args.step_seconds, stop)
        last_loss, lr = trainer.train_step(batch)
        step += 1
        metrics.append({"step": step, "epoch": epoch, "loss": last_loss, "lr": lr, "time": time.time()})
        took = time.monotonic() - t0
        sec_per_step = took if sec_per_step is None else 0.8 * sec_per_step + 0.2 * took
        if step % args.ckpt_every == 0 or step == args.steps:
            metrics.sync()
            save_checkpoint(ckpt_dir, trainer, cfg, step, steps_per_epoch, last_loss, args.keep)
            saved_at = step
        if step % args.heartbeat_every == 0 or step == args.steps:
            heartbeat(step)
        if step % log_every == 0:
            log("step %d/%d epoch %d loss %.6f lr %.5f" % (step, args.steps, epoch, last_loss, lr))

    if step < args.steps:   # stopped by a signal
        if saved_at != step and step > 0:
            metrics.sync()
            path = save_checkpoint(ckpt_dir, trainer, cfg, step, steps_per_epoch, last_loss, args.keep)
            log("saved %s" % os.path.basename(path))
        metrics.close()
        heartbeat(step)
        code = 128 + stop.signum
        log("stopped by signal %d at step %d/%d, %.2fs after the signal; exit %d (rerun the same command "
            "to resume)" % (stop.signum, step, args.steps, time.time() - stop.at, code))
        return code

    metrics.close()
    model_file = "model_final." + trainer.ext
    trainer.export(os.path.join(ckpt_dir, model_file))
    final = {"steps_done": step, "total_steps": args.steps, "loss": last_loss, "eval_loss": trainer.eval_loss(),
             "backend": trainer.name, "resumed_from": start if start else None,
             "params_sha256": trainer.params_sha256(), "seed": args.seed, "finished_at": utc_now(),
             "model_file": model_file}
    write_json(os.path.join(ckpt_dir, "final.json"), final)
    heartbeat(step)
    log("done: %d steps, loss %s, eval_loss %.6f%s" % (step, last_loss, final["eval_loss"],
                                                        " (was already complete)" if start == args.steps else ""))
    return 0


def main(argv=None):
    args = parse_args(argv)
    try:
        return run(args)
    except Incompatible as exc:
        sys.stderr.write("train_resumable: %s (--ckpt-dir %s)\n" % (exc, args.ckpt_dir))
        return 2
    except Unreadable as exc:
        sys.stderr.write("train_resumable: %s\n" % exc)
        return 1
    except OSError as exc:
        sys.stderr.write("train_resumable: %s\n" % exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
