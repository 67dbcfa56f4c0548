"""The one evidence format (scripts/node/evidence.py): build, parse, verify, and content checks."""
import json
import os
import pickle
import struct
import sys
import zipfile

import pytest

from conftest import NODE, need_module

sys.path.insert(0, str(NODE))
import evidence as ev  # noqa: E402


def torch_like_zip(path, with_data_pkl=True):
    """A zip laid out like torch.save's archive (a stand-in when torch is absent)."""
    with zipfile.ZipFile(path, "w") as archive:
        if with_data_pkl:
            archive.writestr("ckpt/data.pkl", pickle.dumps({"step": 3}))
        archive.writestr("ckpt/data/0", b"\0" * 4096)


def safetensors_file(path, data_len=16, claim=16):
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, claim]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * data_len)


def build(root, roster, **kw):
    return ev.build_manifest(str(root), roster, "run-1", progress=False, **kw)


# ---------------------------------------------------------------- content checks

@pytest.mark.drill("damaged evidence fails with a reason")
def test_a_real_torch_checkpoint_passes_and_a_truncated_one_fails(tmp_path):
    torch = need_module("torch")
    good = tmp_path / "ckpt.pt"
    torch.save({"model": torch.nn.Linear(4, 4).state_dict(), "step": 7}, good)
    assert ev.content_check(str(good)) == ("torch-zip", None)
    data = good.read_bytes()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(data[: len(data) // 2])  # what kill -9 mid-save leaves
    fmt, reason = ev.content_check(str(cut))
    assert fmt == "torch-zip" and "truncated" in reason


@pytest.mark.parametrize("maker,name,fragment", [
    (lambda p: torch_like_zip(p), "ok.pt", None),
    (lambda p: torch_like_zip(p, with_data_pkl=False), "nodata.pt", "no data.pkl"),
    (lambda p: p.write_bytes(b"PK\x03\x04garbage"), "torn.pt", "truncated"),
    (lambda p: p.write_bytes(b"hello world"), "text.pt", "not a torch checkpoint"),
    (lambda p: p.write_bytes(pickle.dumps({"a": 1}, protocol=2)), "legacy.pth", None),
    (lambda p: safetensors_file(p), "ok.safetensors", None),
    (lambda p: safetensors_file(p, data_len=8), "short.safetensors", "truncated"),
    (lambda p: p.write_bytes(struct.pack("<Q", 10 ** 6) + b"{}"), "hdr.safetensors", "does not fit"),
    (lambda p: p.write_bytes(pickle.dumps([1, 2, 3])), "ok.pkl", None),
    (lambda p: p.write_bytes(pickle.dumps([1, 2, 3])[:-1]), "cut.pkl", "STOP"),
    (lambda p: p.write_text('{"acc": 0.9}'), "ok.json", None),
    (lambda p: p.write_text('{"acc": 0.'), "cut.json", "not valid JSON"),
    (lambda p: p.write_bytes(os.urandom(100)), "opaque.bin", None),
])
@pytest.mark.drill("damaged evidence fails with a reason")
def test_content_check_by_format(tmp_path, maker, name, fragment):
    path = tmp_path / name
    maker(path)
    _fmt, reason = ev.content_check(str(path))
    if fragment is None:
        assert reason is None
    else:
        assert reason and fragment in reason


# ---------------------------------------------------------------- building

@pytest.mark.drill("damaged evidence fails with a reason")
def test_build_includes_dotfiles_and_records_formats(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / ".metadata").write_bytes(b"dcp metadata")
    torch_like_zip(tmp_path / "ckpt" / "model.pt")
    manifest, problems, _ = build(tmp_path, ["ckpt/*"])
    assert problems == []
    by_path = {e["path"]: e for e in manifest["files"]}
    assert set(by_path) == {"ckpt/.metadata", "ckpt/model.pt"}
    assert by_path["ckpt/model.pt"]["format"] == "torch-zip" and "format" not in by_path["ckpt/.metadata"]
    assert manifest["file_count"] == 2 and manifest["schema"] == ev.SCHEMA


@pytest.mark.drill("damaged evidence fails with a reason")
def test_a_zero_byte_checkpoint_fails_unless_allowed(tmp_path):
    (tmp_path / "ckpt.pt").write_bytes(b"")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "supervisor.log").write_bytes(b"")
    manifest, problems, _ = build(tmp_path, ["ckpt.pt", "logs/**"], allow_empty=["logs/**"])
    assert manifest is None and [p["code"] for p in problems] == ["empty-file"]
    assert problems[0]["path"] == "ckpt.pt"
    manifest, problems, _ = build(tmp_path, ["ckpt.pt", "logs/**"], allow_empty=["logs/**", "ckpt.pt"])
    assert problems == [] and manifest["allow_empty"] == ["logs/**", "ckpt.pt"]


def test_a_truncated_checkpoint_is_refused_at_build(tmp_path):
    (tmp_path / "ckpt.pt").write_bytes(b"PK\x03\x04" + os.urandom(200))
    manifest, problems, _ = build(tmp_path, ["ckpt.pt"])
    assert manifest is None and problems[0]["code"] == "content"


@pytest.mark.drill("empty roster fails")
def test_empty_roster_result_and_unmatched_entries_fail(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    manifest, problems, _ = build(tmp_path, ["missing/*"])
    assert manifest is None and problems[0]["code"] == "unmatched"


@pytest.mark.drill("damaged evidence fails with a reason")
def test_symlink_escape_and_special_files_fail(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "outside").write_text("secret")
    (root / "escape").symlink_to(tmp_path / "outside")
    os.mkfifo(root / "events.fifo")
    _, problems, _ = build(root, ["escape"])
    assert problems[0]["code"] == "escape"
    _, problems, _ = build(root, ["events.fifo"])
    assert problems[0]["code"] == "special"


# ---------------------------------------------------------------- parsing

def good_manifest(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "a.bin").write_bytes(os.urandom(1000))
    (tmp_path / "r" / ".hidden").write_bytes(b"dot")
    manifest, problems, _ = build(tmp_path / "r", ["**"])
    assert problems == []
    return tmp_path / "r", manifest


@pytest.mark.parametrize("mutate,code", [
    (lambda m: m["files"][0].update(path="../escape"), "unsafe-path"),
    (lambda m: m["files"][0].update(path="/etc/passwd"), "unsafe-path"),
    (lambda m: m["files"][0].update(path="a//b"), "unsafe-path"),
    (lambda m: m["files"][0].update(size=0, sha256="0" * 64), "empty-file"),
    (lambda m: m["files"][0].update(format="exe"), "manifest"),
    (lambda m: m["files"][0].update(extra=1), "manifest"),
    (lambda m: m.update(surprise=True), "manifest"),
    (lambda m: m["files"].append(dict(m["files"][0])), "duplicate"),
    (lambda m: m.update(file_count=99), "manifest"),
    (lambda m: m.update(files=[]), "manifest"),
])
def test_parse_rejects_a_bad_manifest(tmp_path, mutate, code):
    _root, manifest = good_manifest(tmp_path)
    mutate(manifest)
    _data, problems = ev.parse_manifest(json.dumps(manifest).encode())
    assert code in [p["code"] for p in problems], problems


def test_parse_accepts_what_build_wrote_and_the_schema_agrees(tmp_path):
    jsonschema = need_module("jsonschema")
    _root, manifest = good_manifest(tmp_path)
    data, problems = ev.parse_manifest(ev.manifest_bytes(manifest))
    assert problems == [] and data == manifest
    schema = json.loads((NODE / "manifest.schema.json").read_text())
    jsonschema.validate(manifest, schema)


# ---------------------------------------------------------------- verification (GUIDE §9 drills)

def test_verify_passes_an_exact_copy(tmp_path):
    root, manifest = good_manifest(tmp_path)
    problems, hashed = ev.verify_tree(str(root), manifest, progress=False)
    assert problems == [] and hashed == manifest["total_bytes"]


@pytest.mark.parametrize("damage,code", [
    (lambda r: r.joinpath("a.bin").write_bytes(b"Z" + r.joinpath("a.bin").read_bytes()[1:]), "sha256"),
    (lambda r: r.joinpath("a.bin").write_bytes(r.joinpath("a.bin").read_bytes()[:10]), "truncated"),
    (lambda r: r.joinpath("a.bin").unlink(), "missing"),
    (lambda r: r.joinpath("extra.txt").write_text("x"), "extra"),
    (lambda r: r.joinpath(".dotextra").write_text("x"), "extra"),
    (lambda r: r.joinpath("link").symlink_to("/etc/hostname"), "symlink"),
])
def test_verify_catches_each_kind_of_damage(tmp_path, damage, code):
    root, manifest = good_manifest(tmp_path)
    damage(root)
    problems, _ = ev.verify_tree(str(root), manifest, progress=False)
    assert code in [p["code"] for p in problems], problems
