"""Profiles: schema, body structure, the generated index/tables, and the money facts.

Every profile's frontmatter must validate against profiles/profile.schema.json; broken copies must
fail, each kind of break on its own. Every profile has the eight sections in order. The builder
(tools/build_profile_index.py) is run for real on temporary copies of the tree: --check passes on
fresh output and fails on a stale one; a rebuild reproduces the committed bytes. Finally, spot checks
on the facts that cost the most money or data if they were wrong, for every platform.
"""
import copy
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NODE, REPO, SCRIPTS, TOOLS, h2_sections, need_module, prose_lines as prose

PROFILES = REPO / "profiles"
BUILDER = TOOLS / "build_profile_index.py"
SCHEMA_PATH = PROFILES / "profile.schema.json"
EXPECTED_IDS = ["local", "autodl", "runpod", "vastai", "lambda", "paperspace", "china", "generic-ssh"]
PREFIX = {"local": "LO", "autodl": "AD", "runpod": "RP", "vastai": "VA", "lambda": "LA",
          "paperspace": "PS", "china": "CN", "generic-ssh": "GS"}
SECTIONS = ["## 1. Launch", "## 2. Storage", "## 3. Network", "## 4. Interruption and resume",
            "## 5. Teardown and billing", "## 6. Detach", "## 7. Gotchas", "## 8. Script defaults"]
MATRIX_COLUMNS = ["tier", "path", "survives pause", "survives destroy", "caps"]
BEGIN = "<!-- BEGIN GENERATED: platform-table -->"
END = "<!-- END GENERATED: platform-table -->"
SHELL_META = re.compile(r"[;|&`<>]|\$\(")


# ---------------------------------------------------------------- helpers

def _builder_module():
    spec = importlib.util.spec_from_file_location("build_profile_index", BUILDER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def profile_path(pid: str) -> Path:
    path = PROFILES / f"{pid}.md"
    if not path.is_file():
        pytest.fail(f"profiles/{pid}.md is missing (every one of {EXPECTED_IDS} must exist)")
    return path


def frontmatter(pid: str) -> dict:
    yaml = need_module("yaml")
    data, err = _builder_module().read_frontmatter(profile_path(pid), yaml)
    assert err is None, f"profiles/{pid}.md: {err}"
    return data


def body(pid: str) -> str:
    text = profile_path(pid).read_text(encoding="utf-8")
    return text.split("\n---\n", 1)[1]


def sections(pid: str) -> dict:
    """Map each H2 heading to the text under it."""
    return h2_sections(body(pid))


def validator():
    jsonschema = need_module("jsonschema")
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


def error_paths(data) -> list:
    return [".".join(map(str, e.absolute_path)) for e in validator().iter_errors(data)]


def run_builder(root: Path, *args):
    return subprocess.run([sys.executable, str(BUILDER), "--root", str(root), *args],
                          capture_output=True, text=True, timeout=60)


def tree_copy(tmp_path: Path) -> Path:
    """A copy of what the builder reads and writes: profiles/, SKILL.md, README.md."""
    root = tmp_path / "tree"
    shutil.copytree(PROFILES, root / "profiles")
    for name in ("SKILL.md", "README.md"):
        shutil.copy2(REPO / name, root / name)
    return root


def fresh_copy(tmp_path: Path) -> Path:
    need_module("yaml")
    root = tree_copy(tmp_path)
    res = run_builder(root)
    assert res.returncode == 0, res.stderr
    return root


def snapshot(root: Path) -> dict:
    return {p: (root / p).read_bytes() for p in ("profiles/index.json", "SKILL.md", "README.md")}


# ---------------------------------------------------------------- schema

def test_schema_is_valid_draft_2020_12():
    jsonschema = need_module("jsonschema")
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_schema_closes_every_object():
    """additionalProperties: false wherever the schema describes an object with properties."""
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    open_objects = []

    def walk(node, where):
        if isinstance(node, dict):
            conditional = where.rsplit("/", 1)[-1] in {"if", "then", "else"}
            if "properties" in node and not conditional and node.get("additionalProperties") is not False:
                open_objects.append(where or "(root)")
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")

    walk(schema, "")
    assert not open_objects, f"objects without additionalProperties: false: {open_objects}"


@pytest.mark.parametrize("pid", EXPECTED_IDS)
def test_profile_validates_against_schema(pid):
    data = frontmatter(pid)
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
              for e in validator().iter_errors(data)]
    assert not errors, f"profiles/{pid}.md:\n" + "\n".join(errors)
    assert data["platform"] == pid


BREAKS = {
    "unknown top-level key": (lambda d: d.__setitem__("colour", "red"), ""),
    "unknown nested key": (lambda d: d["billing"].__setitem__("discount", "10%"), "billing"),
    "unknown key in a storage tier": (lambda d: d["storage"][0].__setitem__("speed", "fast"), "storage.0"),
    "wrong kind enum": (lambda d: d.__setitem__("kind", "spaceship"), "kind"),
    "wrong detach enum": (lambda d: d.__setitem__("detach", "screen"), "detach"),
    "wrong signal enum": (lambda d: d["interruption"].__setitem__("signal", "SIGSTOP"), "interruption.signal"),
    "bad verified month": (lambda d: d.__setitem__("verified", "2026-13"), "verified"),
    "verified not YYYY-MM": (lambda d: d.__setitem__("verified", "12/2026"), "verified"),
    "source is not a URL": (lambda d: d["sources"].__setitem__(0, "docs.example.com/billing"), "sources.0"),
    "platform id pattern": (lambda d: d.__setitem__("platform", "Local_Box"), "platform"),
    "missing required field": (lambda d: d["billing"].pop("meter_stop_action"), "billing"),
    "no uncertain list": (lambda d: d.pop("uncertain"), ""),
    "table cell over 90 chars": (lambda d: d["billing"].__setitem__("keeps_billing_when_paused", "x" * 91),
                                 "billing.keeps_billing_when_paused"),
    "shutdown flag not bool/unknown": (lambda d: d["billing"].__setitem__("os_shutdown_stops_billing", "maybe"),
                                       "billing.os_shutdown_stops_billing"),
    "negative grace": (lambda d: d["interruption"].__setitem__("grace_seconds", -1), "interruption.grace_seconds"),
    "relative DATA_DIR": (lambda d: d["defaults"].__setitem__("DATA_DIR", "data"), "defaults.DATA_DIR"),
    "destructive flag without a command": (
        lambda d: (d["defaults"].__setitem__("METER_STOP_CMD", None),
                   d["defaults"].__setitem__("METER_STOP_DESTRUCTIVE", True)),
        "defaults.METER_STOP_DESTRUCTIVE"),
}


@pytest.fixture(scope="module")
def base_profile():
    return frontmatter("local")


def test_unbroken_base_validates(base_profile):
    assert error_paths(copy.deepcopy(base_profile)) == []


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_kind_of_break_fails_validation(base_profile, name):
    breaker, expected_path = BREAKS[name]
    data = copy.deepcopy(base_profile)
    breaker(data)
    paths = error_paths(data)
    assert paths, f"{name}: the broken frontmatter still validated"
    assert expected_path in paths, f"{name}: errors at {paths}, expected one at {expected_path!r}"


# ---------------------------------------------------------------- body structure

@pytest.mark.parametrize("pid", EXPECTED_IDS)
def test_sections_present_and_in_order(pid):
    h2 = [line.strip() for line in prose(body(pid)) if line.startswith("## ")]
    assert h2 == SECTIONS, f"profiles/{pid}.md H2 headings are {h2}"


@pytest.mark.parametrize("pid", EXPECTED_IDS)
def test_title_heading_and_box_before_section_1(pid):
    title = frontmatter(pid)["title"]
    lines = list(prose(body(pid)))
    headings = [line for line in lines if line.startswith("# ")]
    assert headings and headings[0].strip() == f"# {title}", f"first H1 should be '# {title}'"
    start = lines.index(headings[0])
    end = next(i for i, line in enumerate(lines) if line.startswith("## 1."))
    assert any(line.startswith(">") for line in lines[start:end]), "no blockquote box under the title"


@pytest.mark.parametrize("pid", EXPECTED_IDS)
def test_storage_section_has_survival_matrix(pid):
    text = sections(pid).get("## 2. Storage", "")
    headers = []
    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            cells = [c.strip().lower() for c in line.strip().strip("|").split("|")]
            headers.append(cells)
    def is_matrix(cells):
        # tier | path | survives <pause verb> | survives <destroy verb> | caps; the platform's own verbs
        # (stop, 关机, terminate ...) are fine, and a family profile may lead with a platform column.
        cells = cells[1:] if cells and cells[0] == "platform" else cells
        return (len(cells) == 5 and cells[:2] == MATRIX_COLUMNS[:2] and cells[4] == "caps"
                and cells[2].startswith("survives") and cells[3].startswith("survives"))

    assert any(is_matrix(h) for h in headers), f"§2 of {pid} has no table with columns {MATRIX_COLUMNS}"


@pytest.mark.parametrize("pid", EXPECTED_IDS)
def test_gotchas_use_the_platform_prefix_and_entry_format(pid):
    text = sections(pid).get("## 7. Gotchas", "")
    assert "../references/run-remote/gotchas.md" in text, "§7 must link the universal gotchas catalog"
    parts = re.split(r"^(?=### )", text, flags=re.M)
    entries = [p for p in parts if p.startswith("### ")]
    assert entries, f"§7 of {pid} has no entries"
    ids = []
    for entry in entries:
        m = re.match(r"^### ([A-Z]{1,3})(\d+) — \S", entry)
        assert m, f"bad gotcha heading: {entry.splitlines()[0]!r}"
        assert m.group(1) == PREFIX[pid], f"{entry.splitlines()[0]!r} should use prefix {PREFIX[pid]}"
        ids.append(m.group(1) + m.group(2))
        for word in ("**Symptom**", "**Cause**", "**Fix**", "**Check**"):
            assert word in entry, f"{ids[-1]} lacks {word}"
        assert re.search(r"^Source: https?://\S+ \([^)]*verified 20\d\d-(0[1-9]|1[0-2])\)", entry, re.M), \
            f"{ids[-1]} lacks a 'Source: <url> (verified YYYY-MM)' line"
    assert len(ids) == len(set(ids)), f"duplicate IDs in {pid}: {ids}"


@pytest.mark.parametrize("pid", EXPECTED_IDS)
def test_teardown_section_names_the_on_node_stop(pid):
    text = sections(pid).get("## 5. Teardown and billing", "")
    cmd = frontmatter(pid)["defaults"]["METER_STOP_CMD"]
    if cmd:
        assert shlex.split(cmd)[0] in text, f"§5 of {pid} does not show its METER_STOP_CMD ({cmd})"
    else:
        assert re.search(r"METER_STOP_CMD|on-node", text), f"§5 of {pid} does not say why there is no on-node stop"


@pytest.mark.parametrize("pid", EXPECTED_IDS)
def test_script_defaults_section_has_table_and_example(pid):
    text = sections(pid).get("## 8. Script defaults", "")
    raw = body(pid).split("## 8. Script defaults", 1)[-1]
    assert re.search(r"^\|.*\|\s*$", text, re.M), f"§8 of {pid} has no defaults table"
    assert re.search(rf"(scripts/node|~/rgt-bin)/run_one\.sh --profile {re.escape(pid)}\b", raw), \
        f"§8 of {pid} lacks a run_one.sh example"


@pytest.mark.parametrize("pid", EXPECTED_IDS)
def test_profile_size_and_line_length(pid):
    text = profile_path(pid).read_text(encoding="utf-8")
    size = len(text.encode("utf-8"))
    assert 4_000 <= size <= 20_000, f"profiles/{pid}.md is {size} bytes"
    long_lines = [n for n, line in enumerate(text.splitlines(), 1) if len(line) > 120]
    assert not long_lines, f"profiles/{pid}.md lines over 120 chars: {long_lines}"


# ---------------------------------------------------------------- the builder

def test_builder_help_runs():
    res = subprocess.run([sys.executable, str(BUILDER), "--help"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0
    assert "--check" in res.stdout and "--root" in res.stdout


def test_repo_index_and_tables_are_fresh():
    need_module("yaml")
    res = run_builder(REPO, "--check")
    assert res.returncode == 0, res.stderr + "\nrun: python3 tools/build_profile_index.py"


def test_rebuild_on_a_copy_reproduces_the_repo_bytes(tmp_path):
    need_module("yaml")
    root = tree_copy(tmp_path)
    before = snapshot(REPO)
    res = run_builder(root)
    assert res.returncode == 0, res.stderr
    assert snapshot(root) == before, "a rebuild changed index.json or a table: the repo copy is stale"


def test_second_run_writes_nothing(tmp_path):
    root = fresh_copy(tmp_path)
    before = snapshot(root)
    res = run_builder(root, "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["written"] == [] and report["ok"] is True
    assert snapshot(root) == before


@pytest.mark.parametrize("pid, old, new, stale", [
    ("local", "DISK_FLOOR_GB: 5", "DISK_FLOOR_GB: 6", {"profiles/index.json"}),
    ("lambda", 'meter_stop_action: "Terminate the instance', 'meter_stop_action: "Terminate now the instance',
     {"profiles/index.json", "SKILL.md", "README.md"}),
])
def test_check_fails_on_a_changed_value_and_writes_nothing(tmp_path, pid, old, new, stale):
    root = fresh_copy(tmp_path)
    assert run_builder(root, "--check").returncode == 0
    path = root / "profiles" / f"{pid}.md"
    text = path.read_text(encoding="utf-8")
    assert old in text, f"fixture text {old!r} not found in {pid}.md"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    before = snapshot(root)
    res = run_builder(root, "--check")
    assert res.returncode == 1
    named = set(re.findall(r"^STALE (\S+):", res.stderr, re.M))
    assert named == stale, res.stderr
    assert snapshot(root) == before, "--check must not write"
    assert run_builder(root).returncode == 0
    assert run_builder(root, "--check").returncode == 0


def test_index_shape_matches_the_contract(tmp_path):
    root = fresh_copy(tmp_path)
    index = json.loads((root / "profiles" / "index.json").read_text(encoding="utf-8"))
    assert index["generated_by"] == "tools/build_profile_index.py"
    assert index["schema_version"] == 1
    stems = {p.stem for p in (root / "profiles").glob("*.md")}
    assert set(index["profiles"]) == stems
    for pid in stems & set(EXPECTED_IDS):
        assert index["profiles"][pid] == frontmatter(pid)
    raw = (root / "profiles" / "index.json").read_text(encoding="utf-8")
    assert raw == json.dumps(index, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def test_table_rows_local_first_then_alphabetical(tmp_path):
    root = fresh_copy(tmp_path)
    for name in ("SKILL.md", "README.md"):
        text = (root / name).read_text(encoding="utf-8")
        block = text.split(BEGIN, 1)[1].split(END, 1)[0]
        rows = [line for line in block.splitlines() if line.startswith("| [")]
        ids = [re.search(r"\]\(profiles/([a-z0-9-]+)\.md\)", r).group(1) for r in rows]
        assert ids[0] == "local"
        assert ids[1:] == sorted(ids[1:])
        index = json.loads((root / "profiles" / "index.json").read_text(encoding="utf-8"))["profiles"]
        assert set(ids) == set(index)
        for row, pid in zip(rows, ids):
            assert row.startswith(f"| [{index[pid]['title']}](profiles/{pid}.md) |")
            assert (root / "profiles" / f"{pid}.md").is_file()
        header = block.strip().splitlines()[0]
        if name == "SKILL.md":  # the hub's budget: the stop only; the rest is one hop away (the profile's §5)
            assert header == "| Platform | Stop the meter |"
            continue
        assert header == "| Platform | Stop the meter | What that destroys | Still billing when paused | Checked |"
        for row, pid in zip(rows, ids):  # the month the money facts were last checked, so staleness shows
            assert row.rstrip().endswith(f"| {index[pid]['verified']} |")


def test_missing_markers_exit_2_and_write_nothing(tmp_path):
    root = fresh_copy(tmp_path)
    (root / "profiles" / "local.md").write_text(
        (root / "profiles" / "local.md").read_text(encoding="utf-8").replace("DISK_FLOOR_GB: 5", "DISK_FLOOR_GB: 7"),
        encoding="utf-8")
    readme = root / "README.md"
    readme.write_text(readme.read_text(encoding="utf-8").replace(END, ""), encoding="utf-8")
    before = snapshot(root)
    res = run_builder(root)
    assert res.returncode == 2
    assert "README.md" in res.stderr and "Traceback" not in res.stderr
    assert snapshot(root) == before


def test_invalid_profiles_exit_1_listing_every_error(tmp_path):
    root = fresh_copy(tmp_path)
    lam = root / "profiles" / "lambda.md"
    lam.write_text(lam.read_text(encoding="utf-8").replace("kind: cloud-vm", "kind: spaceship"), encoding="utf-8")
    loc = root / "profiles" / "local.md"
    loc.write_text(loc.read_text(encoding="utf-8").replace("verified: 2026-12", "verified: 2026-12-01"),
                   encoding="utf-8")
    shutil.copy2(root / "profiles" / "paperspace.md", root / "profiles" / "renamed.md")
    before = snapshot(root)
    res = run_builder(root)
    assert res.returncode == 1
    assert "profiles/lambda.md: kind:" in res.stderr
    assert "profiles/local.md: verified:" in res.stderr
    assert "profiles/renamed.md: platform:" in res.stderr
    assert "Traceback" not in res.stderr
    assert snapshot(root) == before


def test_missing_pyyaml_is_a_usage_error(tmp_path):
    root = tree_copy(tmp_path)
    code = ("import runpy, sys; sys.modules['yaml'] = None; "
            f"sys.argv = ['x', '--root', {str(root)!r}]; "
            f"runpy.run_path({str(BUILDER)!r}, run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2
    assert "pyyaml" in res.stderr.lower() and "Traceback" not in res.stderr


# ---------------------------------------------------------------- money and data facts

@pytest.mark.parametrize("pid", EXPECTED_IDS)
def test_meter_stop_fields_are_consistent(pid):
    d = frontmatter(pid)["defaults"]
    b = frontmatter(pid)["billing"]
    cmd = d["METER_STOP_CMD"]
    if cmd is None:
        assert d["METER_STOP_DESTRUCTIVE"] is False
        return
    argv = shlex.split(cmd)
    assert argv, "METER_STOP_CMD splits to nothing"
    assert not SHELL_META.search(cmd), f"METER_STOP_CMD {cmd!r} needs a shell; it is run without one"
    assert d["METER_STOP_NEEDS"], "a METER_STOP_CMD must say what it needs on the node"
    if d["METER_STOP_DESTRUCTIVE"]:
        assert b["meter_stop_destroys"].strip().lower() != "nothing"


def test_local_has_nothing_to_stop():
    fm = frontmatter("local")
    assert fm["defaults"]["METER_STOP_CMD"] is None
    assert fm["kind"] == "owned"
    assert fm["billing"]["meter_stop_destroys"] == "nothing"


def test_autodl_data_disk_and_release_clock():
    fm = frontmatter("autodl")
    tiers = {t["path"]: t for t in fm["storage"]}
    assert "/root/autodl-tmp" in tiers, "the data disk /root/autodl-tmp must be a storage tier"
    assert tiers["/root/autodl-tmp"]["survives_destroy"] is False
    assert re.search(r"\b15\b", fm["billing"]["auto_release"] or ""), "the release-after-power-off clock"
    assert fm["network"]["behind_gfw"] is True
    assert fm["defaults"]["DURABLE_DIR"] and fm["defaults"]["HF_HOME"].startswith("/root/autodl-tmp")


def test_runpod_terminate_and_stopped_volume_billing():
    b = frontmatter("runpod")["billing"]
    assert "terminate" in b["meter_stop_action"].lower()
    assert "volume" in b["keeps_billing_when_paused"].lower()
    assert "volume" in b["meter_stop_destroys"].lower()


def test_vastai_paused_storage_keeps_billing():
    b = frontmatter("vastai")["billing"]
    keeps = b["keeps_billing_when_paused"].lower()
    assert re.search(r"storage|disk", keeps) and "nothing" not in keeps
    assert "destroy" in b["meter_stop_action"].lower()


def test_lambda_shutdown_does_not_stop_billing():
    fm = frontmatter("lambda")
    assert fm["billing"]["os_shutdown_stops_billing"] is False
    assert fm["billing"]["pause_action"] is None
    assert "terminate" in fm["billing"]["meter_stop_action"].lower()
    assert "filesystem" in fm["billing"]["keeps_billing_when_paused"].lower()
    cmd = fm["defaults"]["METER_STOP_CMD"] or ""
    assert "shutdown" not in cmd and "poweroff" not in cmd


def test_paperspace_off_still_bills_storage_and_delete_takes_snapshots():
    b = frontmatter("paperspace")["billing"]
    assert b["pause_action"]
    assert re.search(r"storage", b["keeps_billing_when_paused"].lower())
    assert re.search(r"\bip\b", b["keeps_billing_when_paused"].lower())
    assert "snapshot" in b["meter_stop_destroys"].lower()


def test_china_is_behind_the_gfw():
    net = frontmatter("china")["network"]
    assert net["behind_gfw"] is True and net["mirrors_needed"] is True


def test_generic_ssh_has_no_blind_stop():
    fm = frontmatter("generic-ssh")
    assert fm["defaults"]["METER_STOP_CMD"] is None
    assert fm["billing"]["os_shutdown_stops_billing"] == "unknown"
    assert fm["detach"] == "tmux"


# ---------------------------------------------------------------- certainty in the data (issue 40)

@pytest.mark.parametrize("pid", EXPECTED_IDS)
def test_every_profile_has_an_uncertain_list_naming_real_fields(pid):
    """Every profile carries `uncertain` (empty when nothing is in doubt); each entry names a field it has."""
    from test_profile_consistency import resolve_field
    fm = frontmatter(pid)
    assert isinstance(fm.get("uncertain"), list), f"profiles/{pid}.md has no uncertain list"
    for entry in fm["uncertain"]:
        found, _value, _extra = resolve_field(fm, entry["field"])
        assert found, f"profiles/{pid}.md: uncertain names {entry['field']!r}, which it does not have"
        assert re.search(r"20\d\d-\d\d", entry["note"]), f"{pid} {entry['field']}: the note gives no month"


def uncertain_fields(pid):
    return {e["field"] for e in frontmatter(pid)["uncertain"]}


def test_issue40_lambda_shutdown_and_attach_at_launch_are_flagged():
    assert {"billing.os_shutdown_stops_billing", "storage[filesystem (network, persistent)].caps"} <= \
        uncertain_fields("lambda")
    body = profile_path("lambda").read_text(encoding="utf-8")
    assert "does **not** stop billing" not in body


def test_issue40_autodl_in_instance_shutdown_and_cardless_fee_are_flagged():
    b = frontmatter("autodl")["billing"]
    assert {"billing.os_shutdown_stops_billing", "billing.meter_stop_action", "billing.pause_action"} <= \
        uncertain_fields("autodl")
    assert "unconfirmed" in b["meter_stop_action"] and "small hourly fee" not in b["pause_action"]
    skill = (REPO / "SKILL.md").read_text(encoding="utf-8")
    assert "console button, or `shutdown` inside the instance" not in skill


def test_issue40_runpod_network_volumes_bill_hourly_and_aliases_are_named():
    fm = frontmatter("runpod")
    gran = fm["billing"]["granularity"]
    assert "network volumes hourly" in gran and "disputed" not in gran
    body = profile_path("runpod").read_text(encoding="utf-8")
    for verb in ("runpodctl pod delete", "`pod rm`", "`pod remove`", "runpodctl remove pod", "runpodctl stop pod",
                 "runpodctl pod stop"):
        assert verb in body, verb
