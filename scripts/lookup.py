#!/usr/bin/env python3
"""Prints just the entry that matches an ID or the user's words, so an agent reads 1-2 KB instead of a whole file.

Every catalog under references/ and profiles/ holds entries (`### U16 — title`, then Symptom, Cause,
Fix, Check); references also carry a symptom index (what the user sees -> entry). This script searches
those indexes and the entries' titles and Symptom lines, and prints the best entry in full, then a
`Related:` line (the entries it names and the entries that name it) and the runners-up one line each,
so an agent reads one 1-2 KB entry, not a 15-25 KB file. Run it before opening any file.

Usage:
  python3 scripts/lookup.py U16                        # one entry by ID (several: U16 M2 RP1)
  python3 scripts/lookup.py "No space left on device"  # an error message or symptom words
  python3 scripts/lookup.py --in references/training/oom-memory.md "OOM on step 2"
  python3 scripts/lookup.py --index references/run-remote/gotchas.md   # a file's symptom index only
  python3 scripts/lookup.py --list                     # every entry: ID, title, file
  python3 scripts/lookup.py --json --top 3 "loss is NaN"

Options:
  QUERY ...     entry IDs (U16, RP2; any case) print exactly those entries; anything else is searched
  --in FILE     search only this catalog (repeatable); a path relative to the skill folder
  --index FILE  print FILE's opening lines and its symptom index (its entry list if it has no index)
  --list        list every entry's ID, title and file
  --top N       print the N best matches in full (default 1); up to 4 more are listed by title
  --root DIR    the skill folder (default: the folder that holds scripts/)
  --json        print JSON (id, file, title, score, text) instead of text

Exit codes: 0 something printed; 1 nothing matched; 2 usage or bad input (an unknown --in file).
"""
import math
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "node"))
import rgt_core as core  # noqa: E402  (the shared core: one error line, one exit-code contract)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CATALOG_DIRS = ("references", "profiles")
ENTRY = re.compile(r"^###\s+([A-Z]{1,3}\d+)\s+—\s+(.*\S)")
ID_ONLY = re.compile(r"^[A-Za-z]{1,3}\d+$")
HEADING = re.compile(r"^#{1,3}\s")
FENCE = re.compile(r"^\s*(```|~~~)")
INDEX_HEADING = re.compile(r"^#{2,3}\s+symptom index\b", re.I)
LINK_ID = re.compile(r"\[[^\]]*?\b([A-Z]{1,3}\d+)\b[^\]]*\]\(([^)\s]*)\)")
RUNNERS_UP = 4
RELATED_MAX = 6
BARE_ID = re.compile(r"(?<![\w#/-])([A-Z]{1,3}\d+)\b")

# ---------------------------------------------------------------- words (shared with evals/run_evals.py)

STOP = frozenset("""
a about above after again all also am an and any are as at be because been before being below between
both but by can could did do does doing done down during each even ever every few for from get gets got
had has have having he her here hers him his how i if in into is it its itself just like me mine more
most much my myself need needs no nor not now of off on once one only or other our out over own same
she should so some such than that the their them then there these they this those through to too try
tried trying under until up us use used using very via want wanted was way we well were what when where
which while who whom why will with would yet you your yours still really any anything something keep
kept ok okay please thanks help make made sure first again also
""".split())
CJK = re.compile(r"[\u3400-\u9fff]+")
WORD = re.compile(r"[a-z0-9]+(?:[._+/-][a-z0-9]+)*|[\u3400-\u9fff]+")


def stem(word):
    """A crude suffix stripper: checkpoints/checkpointing -> checkpoint, saved/saving/save -> sav."""
    if len(word) <= 3 or not word.isalpha():
        return word
    for suffix in ("ies", "sses", "ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            if suffix == "ies":
                word = word[:-3] + "y"
            elif suffix == "sses":
                word = word[:-2]
            elif suffix == "es" and not re.search(r"(s|x|z|ch|sh)es$", word):
                word = word[:-1]
            elif suffix != "s" or not word.endswith(("ss", "us", "is")):
                word = word[:-len(suffix)]
            break
    if len(word) > 4 and word[-1] == word[-2] and word[-1] not in "lsz":
        word = word[:-1]  # runn -> run, stopp -> stop
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]  # save, saving, saved -> sav
    return word


def words(text):
    """The set of search terms in TEXT: stemmed English words, their dotted/dashed compounds, CJK bigrams."""
    out = set()
    for m in WORD.finditer(text.lower()):
        w = m.group(0)
        if CJK.match(w):
            out |= {w} if len(w) == 1 else {w[i:i + 2] for i in range(len(w) - 1)}
            continue
        parts = re.split(r"[._+/-]", w)
        if len(parts) > 1:
            out.add(w)
        for p in parts:
            if p and p not in STOP and (len(p) > 1 or p.isdigit()):
                out.add(stem(p))
    return out


class Ranker(object):
    """BM25 over small documents (k1 1.2, b 0.75); a query is a set of words."""

    def __init__(self, docs, k1=1.2, b=0.75):
        self.docs = [dict() for _ in docs]
        for counts, doc in zip(self.docs, docs):
            for w in doc:
                counts[w] = counts.get(w, 0) + 1
        self.lengths = [sum(c.values()) for c in self.docs]
        self.avg = sum(self.lengths) / float(max(1, len(self.docs))) or 1.0
        df = {}
        for counts in self.docs:
            for w in counts:
                df[w] = df.get(w, 0) + 1
        n = len(self.docs)
        self.idf = {w: math.log(1 + (n - d + 0.5) / (d + 0.5)) for w, d in df.items()}
        self.k1, self.b = k1, b
        self.postings = {}   # word -> [(doc, its term weight)]: a query touches only the documents that hold it
        for i, counts in enumerate(self.docs):
            norm = k1 * (1 - b + b * self.lengths[i] / self.avg)
            for w, tf in counts.items():
                self.postings.setdefault(w, []).append((i, self.idf[w] * tf * (k1 + 1) / (tf + norm)))

    def score(self, i, query):
        counts, total = self.docs[i], 0.0
        norm = self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avg)
        for w in query:
            tf = counts.get(w)
            if tf:
                total += self.idf[w] * tf * (self.k1 + 1) / (tf + norm)
        return total

    def scores(self, query):
        """{doc: score(doc, QUERY)} for every document holding a query word, summed in the order score() sums."""
        totals = {}
        for w in query:
            for i, weight in self.postings.get(w, ()):
                totals[i] = totals.get(i, 0.0) + weight
        return totals


def doc_words(text):
    """Words of TEXT as a list with repeats (so a term said twice weighs more), for Ranker."""
    out = []
    for line in text.splitlines():
        out.extend(sorted(words(line)))
    return out


# ---------------------------------------------------------------- catalogs

def prose(lines):
    """Yield (index, line, fenced) so headings inside code blocks are not taken for headings."""
    fenced = False
    for i, line in enumerate(lines):
        if FENCE.match(line):
            fenced = not fenced
            yield i, line, True
            continue
        yield i, line, fenced


def catalog_files(root):
    out = []
    for sub in CATALOG_DIRS:
        base = os.path.join(root, sub)
        for folder, dirs, names in os.walk(base):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
            out.extend(os.path.join(folder, n) for n in sorted(names) if n.endswith(".md"))
    return out


def rel(root, path):
    return os.path.relpath(path, root).replace(os.sep, "/")


def read_lines(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read().splitlines()


def parse_entries(path, lines=None):
    """[(id, title, first line index, text)] for every entry in one file."""
    lines = read_lines(path) if lines is None else lines
    starts = [(i, ENTRY.match(l)) for i, l, fenced in prose(lines) if not fenced]
    starts = [(i, m) for i, m in starts if m]
    out = []
    for i, m in starts:
        end = len(lines)
        for j, line, fenced in prose(lines[i + 1:]):
            if not fenced and HEADING.match(line):
                end = i + 1 + j
                break
        out.append((m.group(1), m.group(2), i, "\n".join(lines[i:end]).rstrip() + "\n"))
    return out


def index_rows(lines):
    """[(symptom text, [entry ids], target file part)] from a file's symptom index table."""
    rows, inside = [], False
    for _, line, fenced in prose(lines):
        if fenced:
            continue
        if INDEX_HEADING.match(line):
            inside = True
            continue
        if inside and HEADING.match(line):
            break
        if inside and line.startswith("|") and not re.match(r"^\|[\s:|-]+\|?\s*$", line):
            found = LINK_ID.findall(line)
            if found:
                text = LINK_ID.sub(" ", line).replace("|", " ")
                rows.append((" ".join(text.split()), [f for f, _ in found], found[0][1].partition("#")[0]))
    return rows


def index_text(path, lines=None):
    """What `--index FILE` prints: the opening (title to the first ## heading) and the symptom index."""
    lines = read_lines(path) if lines is None else lines
    out, state = [], "opening"
    for i, line, fenced in prose(lines):
        if i == 0 and line.strip() == "---":  # a profile's YAML header is metadata, not the menu
            state = "yaml"
            continue
        if state == "yaml":
            if line.strip() == "---":
                state = "opening"
            continue
        if state == "opening":
            if not fenced and line.startswith("## "):
                state = "skip"
            else:
                out.append(line)
                continue
        if not fenced and INDEX_HEADING.match(line):
            state = "index"
            out.append(line)
            continue
        if state == "index":
            if not fenced and HEADING.match(line):
                break
            out.append(line)
    if not any(INDEX_HEADING.match(l) for l in out):
        out.append("## Entries")
        out.extend("- %s — %s" % (eid, title) for eid, title, _, _ in parse_entries(path, lines))
    return "\n".join(out).strip() + "\n"


class Catalog(object):
    """Every entry under ROOT's references/ and profiles/, with the words that find it."""

    def __init__(self, root=ROOT, only=None):
        self.root = root
        self.entries = {}   # id -> dict(id, file, title, text)
        self.order = []
        extra = {}          # id -> symptom-index words that point at it (from any file)
        together = {}       # id -> the other ids one symptom-index row names with it
        files = catalog_files(root)
        for path in files:
            lines = read_lines(path)
            for eid, title, _, text in parse_entries(path, lines):
                if eid not in self.entries:
                    self.entries[eid] = {"id": eid, "file": rel(root, path), "title": title, "text": text}
                    self.order.append(eid)
            for symptom, ids, _ in index_rows(lines):
                for eid in ids:
                    extra.setdefault(eid, []).append(symptom)
                    together.setdefault(eid, []).extend(i for i in ids if i != eid)
        for eid in self.order:  # the entries each one names, then the entries that name it
            e = self.entries[eid]
            body = e["text"].split("\n", 1)[1] if "\n" in e["text"] else ""
            named = BARE_ID.findall(body) + together.get(eid, [])
            e["refs"] = [r for r in dict.fromkeys(named) if r in self.entries and r != eid]
        for eid in self.order:
            for ref in self.entries[eid]["refs"]:
                back = self.entries[ref].setdefault("backrefs", [])
                if eid not in back:
                    back.append(eid)
        self.searchable = [e for e in self.order if only is None or self.entries[e]["file"] in only]
        docs = []
        for eid in self.searchable:
            e = self.entries[eid]
            symptom = re.search(r"\*\*Symptom\*\*[^\n]*(?:\n(?!\*\*)[^\n]+)*", e["text"])
            parts = [e["title"], e["title"]] + extra.get(eid, []) + [symptom.group(0) if symptom else ""]
            docs.append(doc_words("\n".join(parts)))
            e["_haystack"] = " ".join("\n".join(parts).lower().split())   # an error string matches across lines
        self.ranker = Ranker(docs)

    def get(self, eid):
        return self.entries.get(eid.upper())

    def search(self, query, limit=5):
        """[(score, entry)] best first; an error string found verbatim in an index row or Symptom wins."""
        q = words(query)
        phrase = " ".join(query.lower().split())
        scored, found = [], self.ranker.scores(q)
        for i, eid in enumerate(self.searchable):
            e = self.entries[eid]
            s = found.get(i, 0.0)
            if len(phrase) >= 8 and phrase in e["_haystack"]:
                s += 100.0
            if s > 0:
                scored.append((s, e))
        scored.sort(key=lambda t: -t[0])
        return scored[:limit]


def related(e):
    """The IDs an entry names, then those that name it, at most RELATED_MAX."""
    ids = list(dict.fromkeys(e.get("refs", []) + e.get("backrefs", [])))[:RELATED_MAX]
    return ids


def render_entry(e):
    text = "%s  (%s)\n%s" % (e["id"], e["file"], e["text"])
    ids = related(e)
    if ids:
        text = text.rstrip("\n") + "\nRelated: %s\n" % " ".join(ids)
    return text


def render_hits(hits, top):
    out = []
    for score, e in hits[:top]:
        out.append(render_entry(e))
    rest = hits[top:top + RUNNERS_UP]
    if rest:
        out.append("Also matching (print one with: lookup.py ID):\n" + "\n".join(
            "  %s — %s  (%s)" % (e["id"], e["title"], e["file"]) for _, e in rest))
    return "\n".join(out)


def lookup_text(catalog, queries, top=1):
    """(text, hits) for QUERIES as the command line gives them: IDs print exactly, the rest is searched."""
    ids = [q for q in queries if ID_ONLY.match(q)]
    if ids and len(ids) == len(queries):
        found = [(0.0, catalog.get(q)) for q in ids if catalog.get(q)]
        return "\n".join(render_entry(e) for _, e in found), found
    hits = catalog.search(" ".join(queries), limit=top + RUNNERS_UP)
    return render_hits(hits, top), hits


def main(argv=None):
    parser = core.Parser(prog="lookup.py", description=__doc__.split("\n")[0],
                         formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
                         epilog=__doc__.split("\n", 2)[2])
    parser.add_argument("query", nargs="*", metavar="QUERY", help="entry IDs, or words / an error message")
    parser.add_argument("--in", dest="within", action="append", metavar="FILE", help="search only this catalog")
    parser.add_argument("--index", metavar="FILE", help="print FILE's opening and symptom index")
    parser.add_argument("--list", action="store_true", help="list every entry's ID, title and file")
    parser.add_argument("--top", type=core.arg_number(int, 1, 50), default=1, help="best matches printed in full")
    parser.add_argument("--root", default=ROOT, metavar="DIR", help="the skill folder")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root)
    if not os.path.isfile(os.path.join(root, "SKILL.md")):
        raise core.UsageError("%s is not a skill folder (no SKILL.md)" % root)
    if args.index:
        path = os.path.join(root, args.index)
        if not os.path.isfile(path):
            raise core.UsageError("no such file: %s" % args.index)
        text = index_text(path)
        if args.json:
            core.emit_json({"file": rel(root, path), "text": text})
        else:
            sys.stdout.write(text)
        return core.EXIT_OK
    only = None
    if args.within:
        only = set()
        for f in args.within:
            if not os.path.isfile(os.path.join(root, f)):
                raise core.UsageError("no such file: %s" % f)
            only.add(rel(root, os.path.join(root, f)))
    catalog = Catalog(root, only)
    if args.list:
        rows = [catalog.entries[e] for e in catalog.searchable]
        if args.json:
            core.emit_json([{k: e[k] for k in ("id", "title", "file")} for e in rows])
        else:
            sys.stdout.write("".join("%s — %s  (%s)\n" % (e["id"], e["title"], e["file"]) for e in rows))
        return core.EXIT_OK
    if not args.query:
        raise core.UsageError("give an entry ID or words to search for, or --index FILE, or --list")
    text, hits = lookup_text(catalog, args.query, args.top)
    if args.json:
        core.emit_json([{"id": e["id"], "file": e["file"], "title": e["title"], "score": round(s, 3),
                         "text": e["text"], "related": related(e)} for s, e in hits])
    elif text:
        sys.stdout.write(text.rstrip("\n") + "\n")
    if not hits:
        if not args.json:
            core.say_error("nothing matched %r; try fewer or other words, or --list" % " ".join(args.query),
                           "lookup.py")
        return core.EXIT_FAIL
    return core.EXIT_OK


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="lookup.py"))
