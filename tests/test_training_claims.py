"""Claims made in references/training/, shown with real PyTorch on the CPU, and scripts/node/ckpt_inspect.py.

Each torch test names the entry it backs. torch comes through need_module, so a laptop without it skips and CI
(RGT_REQUIRE_ALL=1) fails instead. Nothing here depends on timing.
"""
import importlib.util
import json
import os
import pickle
import random
import struct
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO, missing, need_module

INSPECT = REPO / "scripts" / "node" / "ckpt_inspect.py"
# The node folder's version stamp is the toolkit tests' business; here only the inspector's behaviour counts.
ENV = dict(os.environ, RGT_SKIP_VERSION_CHECK="1")


def tiny(torch, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))


# ---------------------------------------------------------------- oom-memory M2

def test_optimizer_state_appears_only_after_first_step():
    """M2: Adam's moments are allocated by the first step(), so memory jumps after step 1."""
    torch = need_module("torch")
    model = tiny(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert opt.state_dict()["state"] == {}
    model(torch.randn(3, 4)).sum().backward()
    assert opt.state_dict()["state"] == {}          # backward alone allocates no optimizer state
    opt.step()
    state = opt.state_dict()["state"]
    n_params = sum(p.numel() for p in model.parameters())
    moments = sum(s[k].numel() for s in state.values() for k in ("exp_avg", "exp_avg_sq"))
    assert len(state) == len(list(model.parameters()))
    assert moments == 2 * n_params                  # two fp32 tensors per parameter: 8 bytes/param


# ---------------------------------------------------------------- convergence O6

def test_accumulation_with_loss_over_n_equals_the_big_batch_gradient():
    """O6: N micro-batches with loss/N give the big batch's gradient; without /N it is N times larger."""
    torch = need_module("torch")
    torch.manual_seed(1)
    model = torch.nn.Linear(5, 1).double()
    x, y = torch.randn(8, 5, dtype=torch.float64), torch.randn(8, 1, dtype=torch.float64)
    loss_fn = torch.nn.MSELoss()

    model.zero_grad()
    loss_fn(model(x), y).backward()
    big = [p.grad.clone() for p in model.parameters()]

    def accumulate(divide):
        model.zero_grad()
        for xs, ys in zip(x.chunk(4), y.chunk(4)):
            loss = loss_fn(model(xs), ys)
            (loss / 4 if divide else loss).backward()
        return [p.grad.clone() for p in model.parameters()]

    for g_big, g_acc in zip(big, accumulate(divide=True)):
        assert torch.allclose(g_big, g_acc, rtol=1e-12, atol=1e-12)
    for g_big, g_raw in zip(big, accumulate(divide=False)):
        assert torch.allclose(g_raw, 4 * g_big, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- checkpoint-resume C1, C3

def run_steps(torch, np, model, opt, sched, data, start, stop):
    """Train steps [start, stop): dropout draws torch RNG, the batch order draws numpy and python RNG."""
    for step in range(start, stop):
        idx = np.random.permutation(len(data))[:4]
        jitter = random.random()
        x = data[idx] + jitter
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def build(torch, seed):
    model = tiny(torch, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    return model, opt, sched


def numpy_allow_list(np):
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def full_state(torch, np, model, opt, sched, step):
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "step": step, "epoch": 0, "data": {"position": step},
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}}


def seed_all(torch, np, seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def test_full_state_resume_continues_bit_for_bit(tmp_path):
    """C1: model + optimizer + scheduler + every RNG + step restores the exact trajectory."""
    torch = need_module("torch")
    np = need_module("numpy")
    data = torch.randn(32, 4)

    seed_all(torch, np, 7)
    model, opt, sched = build(torch, 0)
    run_steps(torch, np, model, opt, sched, data, 0, 10)
    straight = {k: v.clone() for k, v in model.state_dict().items()}

    seed_all(torch, np, 7)
    model, opt, sched = build(torch, 0)
    run_steps(torch, np, model, opt, sched, data, 0, 5)
    path = tmp_path / "ckpt.pt"
    torch.save(full_state(torch, np, model, opt, sched, 5), path)

    seed_all(torch, np, 99)                          # a new process: different RNG, fresh objects
    model, opt, sched = build(torch, 3)
    with torch.serialization.safe_globals(numpy_allow_list(np)):
        ck = torch.load(path, weights_only=True)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optimizer"])
    sched.load_state_dict(ck["scheduler"])
    version, internal, gauss = ck["rng"]["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(ck["rng"]["numpy"])
    torch.set_rng_state(ck["rng"]["torch"])
    run_steps(torch, np, model, opt, sched, data, ck["step"], 10)
    for k, v in model.state_dict().items():
        assert torch.equal(v, straight[k]), k


def test_weights_only_resume_does_not_continue(tmp_path):
    """C1: restoring the weights alone gives a different run (cold optimizer, restarted schedule, new RNG)."""
    torch = need_module("torch")
    np = need_module("numpy")
    data = torch.randn(32, 4)
    seed_all(torch, np, 7)
    model, opt, sched = build(torch, 0)
    run_steps(torch, np, model, opt, sched, data, 0, 10)
    straight = {k: v.clone() for k, v in model.state_dict().items()}

    seed_all(torch, np, 7)
    model, opt, sched = build(torch, 0)
    run_steps(torch, np, model, opt, sched, data, 0, 5)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    seed_all(torch, np, 99)
    model, opt, sched = build(torch, 3)
    model.load_state_dict(weights)
    run_steps(torch, np, model, opt, sched, data, 5, 10)
    assert not all(torch.equal(v, straight[k]) for k, v in model.state_dict().items())


def test_weights_only_load_refuses_numpy_rng_state_until_allow_listed(tmp_path):
    """C3: torch >= 2.6 loads with weights_only=True; a saved numpy RNG state needs an allow-list (or a trusted
    weights_only=False)."""
    torch = need_module("torch")
    np = need_module("numpy")
    path = tmp_path / "rng.pt"
    torch.save({"step": 3, "numpy_rng": np.random.get_state()}, path)
    with pytest.raises(pickle.UnpicklingError, match="numpy"):
        torch.load(path)                             # the default is weights_only=True
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    with torch.serialization.safe_globals(numpy_allow_list(np)):
        ck = torch.load(path, weights_only=True)
    assert ck["numpy_rng"][0] == "MT19937" and np.array_equal(ck["numpy_rng"][1], np.random.get_state()[1])
    trusted = torch.load(path, weights_only=False)  # only for files you made yourself
    assert trusted["step"] == 3


# ---------------------------------------------------------------- data-pipeline DP1

class Draws:
    """Each item: (worker id, a draw from numpy's global RNG, a draw from a generator built in __init__)."""

    def __init__(self, np):
        self.np = np
        self.own = np.random.default_rng(0)          # built once in the parent, copied into every worker

    def __len__(self):
        return 4

    def __getitem__(self, i):
        from torch.utils.data import get_worker_info
        return get_worker_info().id, int(self.np.random.randint(1 << 30)), int(self.own.integers(1 << 30))


def reseed_own(worker_id):
    from torch.utils.data import get_worker_info
    info = get_worker_info()
    info.dataset.own = info.dataset.np.random.default_rng(info.seed)


def first_draw_per_worker(torch, np, **kwargs):
    from torch.utils.data import DataLoader
    loader = DataLoader(Draws(np), batch_size=None, num_workers=2, multiprocessing_context="fork", **kwargs)
    firsts = {}
    for wid, global_draw, own_draw in loader:
        firsts.setdefault(int(wid), (global_draw, own_draw))
    return firsts


def test_workers_get_distinct_numpy_seeds_but_copied_generators_repeat():
    """DP1: since torch 1.9 each worker reseeds numpy's global RNG; a Generator built before the fork is
    duplicated in every worker until worker_init_fn reseeds it from get_worker_info().seed."""
    torch = need_module("torch")
    np = need_module("numpy")
    if sys.platform == "win32":
        missing("the fork start method is POSIX-only (run the suite on Linux)")
    torch.manual_seed(0)
    firsts = first_draw_per_worker(torch, np)
    assert sorted(firsts) == [0, 1]
    assert firsts[0][0] != firsts[1][0]              # numpy global RNG: distinct per worker
    assert firsts[0][1] == firsts[1][1]              # copied Generator: identical in both workers
    firsts = first_draw_per_worker(torch, np, worker_init_fn=reseed_own)
    assert firsts[0][1] != firsts[1][1]


# ---------------------------------------------------------------- scripts/node/ckpt_inspect.py

def inspect_cli(*args):
    res = subprocess.run([sys.executable, str(INSPECT), *map(str, args)], capture_output=True, text=True,
                         timeout=120, env=ENV)
    assert "Traceback" not in res.stderr, res.stderr
    return res


def inspect_json(*args):
    res = inspect_cli(*args, "--json")
    return res.returncode, json.loads(res.stdout)


def test_inspect_reports_every_part_of_a_full_state_checkpoint(tmp_path):
    torch = need_module("torch")
    np = need_module("numpy")
    model, opt, sched = build(torch, 0)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    state = full_state(torch, np, model, opt, sched, 12)
    state["scaler"] = torch.amp.GradScaler("cpu", enabled=False).state_dict()
    torch.save(state, tmp_path / "full.pt")
    rc, rep = inspect_json(tmp_path / "full.pt", "--require", "full", "--require", "scaler")
    assert rc == 0 and rep["status"] == "OK", rep
    assert all(rep["parts"].values()) and rep["missing_for_resume"] == []
    assert rep["step"] == 12 and rep["epoch"] == 0 and rep["rng"] == ["numpy", "python", "torch"]
    assert rep["loaded_with"] == "weights_only=True + numpy allow-list"


def test_inspect_flags_missing_optimizer_and_rng(tmp_path):
    torch = need_module("torch")
    model, opt, sched = build(torch, 0)
    torch.save({"model": model.state_dict(), "scheduler": sched.state_dict(), "step": 3, "data": {}},
               tmp_path / "thin.pt")
    rc, rep = inspect_json(tmp_path / "thin.pt")
    assert rc == 0 and rep["missing_for_resume"] == ["optimizer", "rng"]
    rc, rep = inspect_json(tmp_path / "thin.pt", "--require", "full")
    assert rc == 1 and rep["status"] == "FAIL"
    assert "required but not found: optimizer rng" in rep["problems"]
    res = inspect_cli(tmp_path / "thin.pt", "--require", "optimizer")
    assert res.returncode == 1 and "optimizer" in res.stdout


def test_inspect_says_when_optimizer_state_is_still_empty(tmp_path):
    torch = need_module("torch")
    model, opt, _ = build(torch, 0)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "early.pt")
    rc, rep = inspect_json(tmp_path / "early.pt")
    assert rc == 0 and any("optimizer state is empty" in n for n in rep["notes"])


def test_inspect_reads_a_dcp_folder_and_refuses_one_without_metadata(tmp_path):
    torch = need_module("torch")
    import warnings
    import torch.distributed.checkpoint as dcp
    model, opt, _ = build(torch, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")              # "assuming the intent is to save in a single process"
        dcp.save({"model": model.state_dict(), "step": 4}, checkpoint_id=str(tmp_path / "dcp"))
    rc, rep = inspect_json(tmp_path / "dcp")
    assert rc == 0 and rep["format"] == "torch.distributed.checkpoint"
    assert rep["parts"]["model"] and rep["parts"]["step"] and not rep["parts"]["optimizer"]
    (tmp_path / "dcp" / ".metadata").unlink()
    rc, rep = inspect_json(tmp_path / "dcp")
    assert rc == 1 and "no .metadata" in rep["problems"][0]


def torch_like_zip(path):
    """A stand-in torch.save archive written with the standard library: archive/data.pkl + one storage."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({"step": 1}, protocol=2))
        zf.writestr("archive/data/0", os.urandom(4096))
        zf.writestr("archive/version", "3\n")
    return path


def test_inspect_fails_a_truncated_checkpoint(tmp_path):
    good = torch_like_zip(tmp_path / "good.pt")
    data = good.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) * 2 // 3])
    rc, rep = inspect_json(tmp_path / "cut.pt")
    assert rc == 1 and rep["corrupt"] and "central directory" in rep["problems"][0]
    res = inspect_cli(tmp_path / "cut.pt")
    assert res.returncode == 1 and "previous good generation" in res.stdout


def test_inspect_fails_an_empty_file(tmp_path):
    (tmp_path / "zero.pt").write_bytes(b"")
    rc, rep = inspect_json(tmp_path / "zero.pt")
    assert rc == 1 and "empty file" in rep["problems"][0]


def test_inspect_checks_the_container_without_torch(tmp_path):
    """No torch: the container is still checked; parts are not listed and count as missing for --require."""
    path = torch_like_zip(tmp_path / "c.pt")
    code = ("import os, runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; "
            "sys.path.insert(0, os.path.dirname(sys.argv[0])); "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code, str(INSPECT), str(path), "--json"], capture_output=True,
                         text=True, timeout=60, env=ENV)
    rep = json.loads(res.stdout)
    assert res.returncode == 0 and rep["format"] == "torch zip" and not rep["parts_known"], res.stderr
    res = subprocess.run([sys.executable, "-c", code, str(INSPECT), str(path), "--require", "model"],
                         capture_output=True, text=True, timeout=60, env=ENV)
    assert res.returncode == 1 and "not listed" in res.stdout


def safetensors_bytes(tensors):
    """Write the safetensors format by hand: u64 header length, JSON header, raw little-endian data."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, b"", 0
    for name, values in tensors.items():
        raw = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": [len(values)], "data_offsets": [offset, offset + len(raw)]}
        blobs += raw
        offset += len(raw)
    head = json.dumps(header).encode("utf-8")
    return struct.pack("<Q", len(head)) + head + blobs


def test_inspect_parses_a_hand_written_safetensors_file(tmp_path):
    blob = safetensors_bytes({"fc.weight": [0.5] * 6, "fc.bias": [1.0, 2.0]})
    (tmp_path / "m.safetensors").write_bytes(blob)
    rc, rep = inspect_json(tmp_path / "m.safetensors", "--require", "model")
    assert rc == 0 and rep["format"] == "safetensors" and rep["entries"] == 2
    assert rep["missing_for_resume"] == ["optimizer", "scheduler", "rng", "step", "data"]
    (tmp_path / "cut.safetensors").write_bytes(blob[:-4])
    rc, rep = inspect_json(tmp_path / "cut.safetensors")
    assert rc == 1 and "truncated" in rep["problems"][0]


@pytest.mark.parametrize("args, fragment", [
    ([], "required: path"),
    (["{tmp}/nope.pt"], "no such file or directory"),
    (["{tmp}", "--require", "weights"], "--require weights"),
    (["{tmp}", "--bogus"], "unrecognized arguments"),
])
def test_inspect_bad_usage_is_one_line_and_exit_2(tmp_path, args, fragment):
    res = inspect_cli(*[a.format(tmp=tmp_path) for a in args])
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("ckpt_inspect.py: error: ")
    assert fragment in lines[0] and res.stdout == ""


def test_inspect_help_lists_usage_options_and_exit_codes():
    res = inspect_cli("--help")
    assert res.returncode == 0
    doc = INSPECT.read_text(encoding="utf-8")
    for word in ("Usage:", "--json", "--require", "Exit codes", "weights_only=True"):
        assert word in doc
    assert "--require" in res.stdout


def test_inspect_function_is_importable(tmp_path):
    sys.path.insert(0, str(INSPECT.parent))  # its sibling core
    spec = importlib.util.spec_from_file_location("ckpt_inspect", INSPECT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    (tmp_path / "zero.pt").write_bytes(b"")
    rep = mod.inspect(str(tmp_path / "zero.pt"))
    assert rep["status"] == "FAIL" and rep["size_bytes"] == 0
    assert mod.classify("optimizer_state_dict") == "optimizer" and mod.classify("total_steps") is None
