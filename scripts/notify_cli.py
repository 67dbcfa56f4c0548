"""rgt.py notify: put the notification config on the node and test it (the laptop side; stdlib only).

  rgt.py notify setup HOST --from FILE [--config-path PATH]
      Validate FILE here (exit 2 before any ssh when it is wrong), then send it on ssh's STDIN to
      `notify.py install` on the node (it reads stdin only), which writes it atomically, mode 0600 (default
      ~/.config/rgt/notify.json there, outside every results dir, so a pull never carries it).
      A --config-path under a durable dir, run dir or results dir the ledger knows (or a pulled results dir)
      is refused (exit 2) before any ssh: the gate would find a file there the pull cannot verify.
      The secrets in FILE never appear in an argv (here or on the node), in the ledger or in output.
  rgt.py notify test HOST [--config-path PATH]
      Run `notify.py test` on the node: one test message to every target, one line per target
      (OK, or FAIL and why). Exit 1 when any target failed; the node's 2 (bad config) and 3 (config
      readable by others) pass through.

rgt.py calls add_parser() when it builds its parser and cmd_notify() to run the command, passing
itself (the module) so the ssh quoting, the reachability check and the ledger are rgt.py's own.
Run by itself, `python3 scripts/notify_cli.py ACTION ...` is `rgt.py notify ACTION ...`, with rgt.py's
global options (--json, -p/--port, -i/--identity, --ssh-config, --node-dir, --ledger).

Exit codes: 0 OK; 1 a target failed (test) or the node could not write the config; 2 usage or a bad
config file; 3 the node refused the config (readable by others); 255 ssh could not reach HOST.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.join(HERE, "node") not in sys.path:
    sys.path.insert(0, os.path.join(HERE, "node"))
import rgt_core as core  # noqa: E402

HELP = "notifications from the node: setup HOST --from FILE, test HOST"


def add_parser(sub, shared):
    """Register `notify setup` and `notify test` under rgt.py's subcommands."""
    exit_codes = core.exit_codes_epilog(__doc__)
    p = sub.add_parser("notify", help=HELP, parents=[shared], description=__doc__.split("\n\n", 1)[1].split(
        "\n\nrgt.py calls", 1)[0], formatter_class=core.RawHelp, epilog=exit_codes)
    actions = p.add_subparsers(dest="notify_action", metavar="ACTION", parser_class=core.Parser,
                               help="setup or test; notify ACTION --help for its options")
    actions.required = True
    s = actions.add_parser("setup", parents=[shared], help="copy a notify config to the node (0600, via stdin)",
                           formatter_class=core.RawHelp, epilog=exit_codes)
    s.add_argument("host", help="ssh alias or user@host")
    s.add_argument("--from", dest="from_file", required=True, metavar="FILE", help="the notify config (JSON)")
    s.add_argument("--config-path", help="where on the node (default ~/.config/rgt/notify.json)")
    t = actions.add_parser("test", parents=[shared], help="send a test message to every target; OK/FAIL each",
                           formatter_class=core.RawHelp, epilog=exit_codes)
    t.add_argument("host", help="ssh alias or user@host")
    t.add_argument("--config-path", help="the config on the node (default ~/.config/rgt/notify.json)")
    return p


def read_local_config(path):
    """FILE's bytes after the same validation the node runs (UsageError names the problem, never a secret)."""
    import notify as node_notify   # the node module (the same validation as there); imported only when needed
    try:
        with open(path, "rb") as handle:
            raw = handle.read(node_notify.MAX_CONFIG_BYTES + 1)
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise core.UsageError("cannot read %s: %s" % (path, exc.strerror or exc))
    config = node_notify.parse_config_bytes(raw, "notify config %s" % path)
    if mode & 0o077:
        sys.stderr.write("%s %s is readable by group or others and holds secrets: chmod 600 %s\n"
                         % (core.WARN, path, path))
    return raw, config


def run_folders(cli, args):
    """Every folder the ledger knows a run's results in: durable dirs (a run dir's DURABLE/runs/RID), run and
    results dirs, the profile's default durable dir, and the local folders pulls brought runs home to."""
    import posixpath
    runs, _boxes = cli.ledger_runs(cli.ledger_events(cli.ledger_path(args.ledger)))
    found = set()
    for rec in runs.values():
        for key in ("run_dir", "results_dir"):
            path = rec.get(key)
            if isinstance(path, str) and path:
                found.add(path)
                parent = posixpath.dirname(posixpath.normpath(path))
                if posixpath.basename(parent) in ("runs", "results"):
                    found.add(posixpath.dirname(parent))    # the durable dir itself
        if isinstance(rec.get("dest"), str) and rec["dest"]:
            found.add(os.path.join(os.path.abspath(os.path.expanduser(rec["dest"])), rec["run_id"]))
        try:
            durable = core.profile_defaults(rec["profile"]).get("DURABLE_DIR") if rec.get("profile") else None
        except (core.UsageError, OSError, ValueError):
            durable = None
        home = os.path.expanduser("~") + os.sep
        if durable:       # as the node names it: its own home, not this laptop's
            found.add("~/" + durable[len(home):] if durable.startswith(home) else durable)
    return found


def check_config_path(cli, args):
    """UsageError when --config-path lies under a folder whose files travel in a pull (finding_laptop_L16):
    the node's manifest never lists it, so the gate would refuse that run for good."""
    import posixpath
    if not args.config_path:
        return
    path = posixpath.normpath(args.config_path)
    for folder in sorted(run_folders(cli, args)):
        base = posixpath.normpath(folder)
        if path == base or path.startswith(base.rstrip("/") + "/"):
            raise core.UsageError("--config-path %s is under %s, a durable or results dir of the ledger: the config "
                                  "holds secrets and would sit among a run's results; keep it outside (default "
                                  "~/.config/rgt/notify.json)" % (args.config_path, folder))


def setup_argv(cli, args):
    """The node command `notify setup` runs: no secret in it, the config goes on stdin."""
    argv = ["python3", cli.node_tool(args, "notify.py"), "install", "--stdin", "--json"]
    if args.config_path:
        argv += ["--config", args.config_path]
    return argv


def _node_error(res, cli, args):
    err = cli.text(res.stderr).strip()
    if "can't open file" in err or "No such file" in err:
        err += " (push the toolkit first: %s)" % cli.again(args, "push", args.host)
    return err[-400:]


def cmd_setup(args, ssh, cli):
    raw, config = read_local_config(args.from_file)
    check_config_path(cli, args)
    res = cli.checked(ssh.run(cli.remote_command(setup_argv(cli, args)), stdin=raw, timeout=120), "notify setup")
    doc = _json(cli.text(res.stdout))
    if res.returncode != 0 or not doc.get("ok"):
        sys.stderr.write("rgt.py: error: notify setup on %s failed (exit %d): %s\n"
                         % (args.host, res.returncode, _node_error(res, cli, args)))
        return res.returncode or core.EXIT_FAIL
    names = ["%s %s" % (t["type"], t["name"]) for t in config["targets"]]
    cli.ledger_append(cli.ledger_path(args.ledger), event="notify_setup", host=args.host,
                      config=doc.get("config"), targets=names)
    fields = {"ok": True, "host": args.host, "config": doc.get("config"), "targets": names,
              "test": cli.again(args, "notify", "test", args.host, *(
                  ["--config-path", args.config_path] if args.config_path else []))}
    return cli.report(args, fields, "%s notify config on %s:%s (mode 0600): %s\nnext:       %s"
                      % (core.OK, args.host, doc.get("config"), ", ".join(names), fields["test"]))


def cmd_test(args, ssh, cli):
    argv = ["python3", cli.node_tool(args, "notify.py"), "test", "--json"]
    if args.config_path:
        argv += ["--config", args.config_path]
    res = cli.checked(ssh.run(cli.remote_command(argv), timeout=180), "notify test")
    doc = _json(cli.text(res.stdout))
    if not isinstance(doc.get("targets"), list):
        sys.stderr.write("rgt.py: error: notify test on %s gave no result (exit %d): %s\n"
                         % (args.host, res.returncode, _node_error(res, cli, args)))
        return res.returncode or core.EXIT_FAIL
    ok = bool(doc.get("ok"))
    if args.json:
        core.emit_json(dict(doc, host=args.host))
    else:
        for row in doc["targets"]:
            print("%-4s %s %r%s" % (row.get("status"), row.get("type"), row.get("target"),
                                    "" if row.get("status") == core.OK else ": %s" % row.get("reason")))
    return core.EXIT_OK if ok else core.EXIT_FAIL


def cmd_notify(args, ssh, cli):
    """Dispatch `rgt.py notify ACTION`; CLI is the rgt module (its ssh helpers and ledger)."""
    return {"setup": cmd_setup, "test": cmd_test}[args.notify_action](args, ssh, cli)


def _json(text):
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _standalone(argv=None):
    sys.path.insert(0, HERE)
    import rgt
    return rgt.main(["notify"] + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(core.run_main(_standalone, prog="rgt.py"))
