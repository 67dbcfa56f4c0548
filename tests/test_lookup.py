"""lookup.py answers the Chinese trigger terms SKILL.md advertises (issue 30; red-team laptop #15)."""
import re
import subprocess
import sys

import pytest

from conftest import REPO, SCRIPTS

sys.path.insert(0, str(SCRIPTS))
import lookup as lk  # noqa: E402

# Each advertised term and the catalog it must land in (the entry there is the one that answers it).
TERMS = {
    "显存不足": "references/training/oom-memory.md",
    "断点续训": "references/training/checkpoint-resume.md",
    "多机多卡": "references/run-remote/multinode.md",
    "随机种子": "references/verifying/methodology.md",
    "利用率": "references/training/throughput-profiling.md",
    "租卡": "references/run-remote/gotchas.md",
    "学术加速": "references/run-remote/china-network.md",
    "租GPU": "references/run-remote/gotchas.md",
    "远程训练": "references/run-remote/gotchas.md",
}


def advertised_terms():
    """The Chinese trigger terms in SKILL.md's description (runs of CJK, with a Latin tail such as 租GPU)."""
    head = (REPO / "SKILL.md").read_text(encoding="utf-8").split("\n---\n", 1)[0]
    desc = head[head.index("description:"):]
    return set(re.findall(r"[\u4e00-\u9fff]+(?:GPU)?", desc))


def test_every_listed_term_is_advertised():
    assert set(TERMS) <= advertised_terms()


@pytest.mark.parametrize("term", sorted(TERMS))
def test_finding_laptop_15_lookup_finds_an_entry_for_the_term(term):
    res = subprocess.run([sys.executable, str(SCRIPTS / "lookup.py"), "--json", term], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    import json
    hits = json.loads(res.stdout)
    assert hits and hits[0]["file"] == TERMS[term], hits[:1]


def test_a_term_no_catalog_holds_finds_nothing():
    assert lk.Catalog(str(REPO)).search("蓝鲸潜水艇") == []


def test_lookup_prints_the_ids_of_related_entries():
    """An entry's `Related:` line names the entries it cites and the entries citing it (issue 40)."""
    res = subprocess.run([sys.executable, str(SCRIPTS / "lookup.py"), "LA1"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    last = res.stdout.rstrip().splitlines()[-1]
    assert last.startswith("Related: ") and "GS2" in last.split()  # GS2 links LA1
    res = subprocess.run([sys.executable, str(SCRIPTS / "lookup.py"), "GS2"], capture_output=True, text=True,
                         timeout=60)
    assert "LA1" in res.stdout.rstrip().splitlines()[-1].split()
    import json
    res = subprocess.run([sys.executable, str(SCRIPTS / "lookup.py"), "--json", "LA1"], capture_output=True,
                         text=True, timeout=60)
    assert "GS2" in json.loads(res.stdout)[0]["related"]
