#!/usr/bin/env python3
"""Renders a portable job request for Slurm, Kubernetes or SkyPilot with one resume contract, or names the bad field.

When a job outgrows one box, hand it to the engine the cluster already runs instead of building an
orchestrator. Say the job once (job_request.schema.json beside this file) and render it:

Usage:
  render_job.py REQUEST --to slurm|k8s-job|pytorchjob|skypilot [--out PATH] [--json]

  REQUEST      the job request, JSON (or YAML when the name ends in .yaml/.yml and PyYAML is installed)
  --to T       slurm: an sbatch script; k8s-job: a batch/v1 Job (Indexed, with a headless Service
               when nodes > 1, and the PVC when outputs.pvc.size_gb is set); pytorchjob: a
               kubeflow.org/v1 PyTorchJob for the Kubeflow training operator; skypilot: a task YAML
  --out PATH   write the rendering there (atomically) instead of printing it
  --json       print a JSON report (target, output path, the contract's variables, warnings; the
               rendered text itself when there is no output path)

The contract every rendering carries (the same one the node launcher gives a job):
  RGT_RUN_ID    the run id; every attempt of the job shares it
  RGT_RUN_DIR   DURABLE_DIR/results/RUN_ID on the durable storage (shared FS, PVC or bucket)
  RGT_HEARTBEAT RGT_RUN_DIR/heartbeat.json: the job writes progress there; the stall rule reads it
  RGT_CKPT_DIR  RGT_RUN_DIR/<checkpoint.dir>: checkpoints go here, written atomically
  RGT_ATTEMPT   1 for the first start, N+1 after each restart (counted in RGT_RUN_DIR/attempts)
  RGT_RESUME_FROM  the newest non-empty checkpoint matching checkpoint.glob, when there is one; the
                checkpoint.resume_args are then appended to the command ({latest} = that path)
  Stop: the job gets checkpoint.stop_signal (SIGTERM by default) and must save and exit within
  checkpoint.save_seconds. Slurm warns warn_seconds before the time limit (USR1 to the batch
  shell); the script forwards the stop signal, waits for the save and requeues the job itself,
  up to deadman.max_restarts times and within deadman.max_hours over all attempts. Kubernetes
  gives the pod a termination grace of save_seconds + 30 s; SkyPilot recovers managed jobs.
  Dead-man: a heartbeat older than deadman.stall_minutes cancels the job (Slurm scancel, else the
  entry exits so the engine stops the pods); caps as above; SkyPilot autostop after
  deadman.idle_minutes tears an idle cluster down.
  With toolkit_dir set, node rank 0 writes PULL_MANIFEST.json from outputs.roster when the job
  succeeds (build_pull_manifest.py from the node toolkit), for pull_verified.py to check.

Exit codes: 0 rendered; 2 usage or a request that fails the schema or the target's needs (one line
naming the field).
"""
import json
import os
import re
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "node"))
import rgt_core as core  # noqa: E402

PROG = "render_job.py"
SCHEMA_PATH = os.path.join(HERE, "job_request.schema.json")
TARGETS = ("slurm", "k8s-job", "pytorchjob", "skypilot")
K8S_GRACE_MARGIN = 30
SKY_RDZV_PORT = 29400
K8S_RDZV_PORT = 29400
PTJ_CONTAINER = "pytorch"  # the training operator finds the container by this name


# ---------------------------------------------------------------------------------- request
def schema_problems(value, schema, where="request"):
    """The JSON Schema subset the request schema uses; one list of 'where: what' strings."""
    out = []
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool}
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return ["%s must be a whole number" % where]
    elif kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            return ["%s must be a number" % where]
    elif kind in types and not isinstance(value, types[kind]):
        return ["%s must be a%s %s" % (where, "n" if kind[0] in "ao" else "", kind)]
    if "enum" in schema and value not in schema["enum"]:
        out.append("%s must be one of %s, not %r" % (where, ", ".join(map(str, schema["enum"])), value))
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            out.append("%s is empty" % where)
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append("%s %r does not match %s" % (where, value, schema["pattern"]))
    if kind in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            out.append("%s must be >= %s" % (where, schema["minimum"]))
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            out.append("%s must be > %s" % (where, schema["exclusiveMinimum"]))
        if "maximum" in schema and value > schema["maximum"]:
            out.append("%s must be <= %s" % (where, schema["maximum"]))
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            out.append("%s needs at least %d item(s)" % (where, schema["minItems"]))
        for i, item in enumerate(value):
            out += schema_problems(item, schema.get("items", {}), "%s[%d]" % (where, i))
    if isinstance(value, dict):
        props = schema.get("properties", {})
        names = schema.get("propertyNames")
        if isinstance(names, dict):
            for key in value:
                out += ["%s key %s" % (where, p.split(" ", 1)[1]) for p in schema_problems(key, names, where)]
        for key in schema.get("required", []):
            if key not in value:
                out.append("%s.%s is required" % (where, key))
        for key, item in value.items():
            if key in props:
                out += schema_problems(item, props[key], "%s.%s" % (where, key))
            elif schema.get("additionalProperties") is False:
                out.append("%s.%s is not a known field" % (where, key))
            elif isinstance(schema.get("additionalProperties"), dict):
                out += schema_problems(item, schema["additionalProperties"], "%s.%s" % (where, key))
    return out


def load_request(path):
    if not os.path.isfile(path):
        raise core.UsageError("no such request file: %s" % path)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise core.UsageError("cannot read %s: %s" % (path, exc))
    if path.endswith((".yaml", ".yml")):
        yaml = need_yaml("a YAML request")
        try:
            req = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise core.UsageError("%s is not valid YAML: %s" % (path, str(exc).splitlines()[0]))
    else:
        try:
            req = json.loads(text)
        except ValueError as exc:
            raise core.UsageError("%s is not valid JSON: %s" % (path, exc))
    with open(SCHEMA_PATH, encoding="utf-8") as handle:
        schema = json.load(handle)
    problems = schema_problems(req, schema)
    if problems:
        more = " (and %d more)" % (len(problems) - 1) if len(problems) > 1 else ""
        raise core.UsageError("%s: %s%s" % (path, problems[0], more))
    return normalise(req)


def control_chars(value, where="request"):
    """Where a string of the request (a key too) holds a newline or another control character: every engine
    pastes some of them into a shell script or an #SBATCH line, where a newline starts a new command."""
    if isinstance(value, dict):
        for key, item in value.items():
            found = control_chars(key, "%s key" % where) or control_chars(item, "%s.%s" % (where, key))
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = control_chars(item, "%s[%d]" % (where, i))
            if found:
                return found
    elif isinstance(value, str) and re.search(r"[\x00-\x1f\x7f]", value):
        return "%s holds a newline or control character (%r)" % (where, value[:60])
    return None


def normalise(req):
    bad = control_chars(req)
    if bad:
        raise core.UsageError(bad)
    res, out = req["resources"], req["outputs"]
    ck = dict({"dir": "ckpt", "glob": "ckpt-*", "resume_args": [], "save_seconds": 60, "stop_signal": "TERM"},
              **req.get("checkpoint", {}))
    ck.setdefault("warn_seconds", 2 * ck["save_seconds"] + 30)
    if ".." in ck["dir"].split("/"):
        raise core.UsageError("checkpoint.dir %r leaves the run dir" % ck["dir"])
    dm = dict({"max_restarts": 3, "max_hours": 24.0, "stall_minutes": 30.0, "idle_minutes": 10},
              **req.get("deadman", {}))
    res = dict({"gpus_per_node": 0, "spot": False}, **res)
    if ck["warn_seconds"] >= res["time_limit_minutes"] * 60:
        raise core.UsageError("checkpoint.warn_seconds (%d) must be shorter than the time limit (%d min)"
                              % (ck["warn_seconds"], res["time_limit_minutes"]))
    for glob in out["roster"] + out.get("allow_empty", []):
        if glob.startswith("/") or ".." in glob.split("/"):
            raise core.UsageError("outputs.roster entry %r must stay inside the run dir" % glob)
    return dict(req, run_id=req.get("run_id", req["name"]), launcher=req.get("launcher", "torchrun"),
                env=req.get("env", {}), resources=res, checkpoint=ck, deadman=dm)


def need_yaml(what):
    try:
        import yaml
    except ImportError:
        raise core.UsageError("%s needs PyYAML (pip install pyyaml)" % what)
    return yaml


# ---------------------------------------------------------------------------------- the entry script
def q(word):
    return shlex.quote(str(word))


def contract_lines(req):
    run_dir = "%s/results/%s" % (req["outputs"]["durable_dir"].rstrip("/"), req["run_id"])
    lines = ["export RGT_RUN_ID=%s" % q(req["run_id"]),
             "export RGT_RUN_DIR=%s" % q(run_dir),
             'export RGT_HEARTBEAT="$RGT_RUN_DIR/heartbeat.json"',
             'export RGT_CKPT_DIR="$RGT_RUN_DIR"/%s' % q(req["checkpoint"]["dir"])]
    lines += ["export %s=%s" % (k, q(v)) for k, v in sorted(req["env"].items())]
    return lines


def entry_script(req, target):
    """The bash every target runs on each node: contract, resume, caps, stall rule, launch, manifest."""
    ck, dm, res = req["checkpoint"], req["deadman"], req["resources"]
    slurm = target == "slurm"
    stall_s = int(dm["stall_minutes"] * 60)
    cap_s = int(dm["max_hours"] * 3600)
    L = ["set -uo pipefail"]
    L += contract_lines(req)
    L += ['mkdir -p "$RGT_CKPT_DIR" "$RGT_RUN_DIR/logs" || { echo "rgt: cannot create $RGT_RUN_DIR" >&2; exit 1; }',
          "cd %s || { echo 'rgt: cannot enter the workdir' >&2; exit 1; }"
          % ('"$HOME/sky_workdir"' if target == "skypilot" else q(req["workdir"])),
          "rgt_rank=%s" % {"slurm": "0", "k8s-job": '"${JOB_COMPLETION_INDEX:-0}"',
                           "pytorchjob": '"${RANK:-0}"', "skypilot": '"${SKYPILOT_NODE_RANK:-0}"'}[target],
          "# attempts over the whole run: counted by node rank 0 in the durable run dir",
          'if [ "$rgt_rank" = 0 ]; then echo "$(date +%s)" >> "$RGT_RUN_DIR/attempts"; fi',
          'RGT_ATTEMPT=$(wc -l < "$RGT_RUN_DIR/attempts" 2>/dev/null || echo 1); export RGT_ATTEMPT=$((RGT_ATTEMPT))',
          'rgt_first=$(head -n1 "$RGT_RUN_DIR/attempts" 2>/dev/null || date +%s)',
          "rgt_cap=%d  # deadman.max_hours over all attempts, in seconds" % cap_s,
          'if [ $(( $(date +%s) - rgt_first )) -ge "$rgt_cap" ]; then',
          '  echo "rgt: dead-man: wall-clock cap of %s h over all attempts reached; not starting" >&2; exit 3' % dm["max_hours"],
          "fi",
          "# resume: the newest non-empty checkpoint by name (zero-padded step numbers sort right; temp files",
          "# of a killed save are never picked)",
          "RGT_RESUME_FROM=''",
          "for f in \"$RGT_CKPT_DIR\"/%s; do" % ck["glob"],
          '  case "$f" in *.tmp|*.partial|*.corrupt) continue ;; esac',
          '  if [ -f "$f" ] && [ -s "$f" ]; then RGT_RESUME_FROM=$f; fi',
          "done",
          "export RGT_RESUME_FROM",
          "rgt_resume=()"]
    if ck["resume_args"]:
        L += ['if [ -n "$RGT_RESUME_FROM" ]; then',
              "  rgt_resume=(%s)" % " ".join(q(a).replace("{latest}", "'\"$RGT_RESUME_FROM\"'") for a in ck["resume_args"]),
              "fi"]
    L += ['echo "rgt: run $RGT_RUN_ID attempt $RGT_ATTEMPT rank $rgt_rank resume-from ${RGT_RESUME_FROM:-none}"']
    L += launch_lines(req, target)
    sig = ck["stop_signal"]
    stop_meter = 'scancel "$SLURM_JOB_ID"' if slurm else 'kill -KILL "$rgt_step" 2>/dev/null'
    L += ["rgt_stop() {  # ask the job to checkpoint and exit",
          ('  scancel --signal=%s "$SLURM_JOB_ID" 2>/dev/null || kill -%s "$rgt_step" 2>/dev/null' % (sig, sig)) if slurm
          else '  kill -%s "$rgt_step" 2>/dev/null' % sig,
          "}",
          "rgt_warned=0"]
    if slurm:
        L += ["rgt_warn() { rgt_warned=1; echo \"rgt: time-limit warning: asking the job to checkpoint\"; rgt_stop; }",
              "trap rgt_warn USR1",
              "trap 'kill -%s \"$rgt_step\" 2>/dev/null' TERM" % sig]
    else:
        L += ["trap 'echo \"rgt: stop signal: forwarding %s\"; rgt_stop' TERM INT" % sig]
    if stall_s > 0:
        L += ["rgt_watch() {  # dead-man stall rule on the heartbeat (armed once the job has written one)",
              "  while sleep 30; do",
              '    [ -f "$RGT_HEARTBEAT" ] || continue',
              '    age=$(( $(date +%s) - $(stat -c %Y "$RGT_HEARTBEAT" 2>/dev/null || date +%s) ))',
              '    if [ "$age" -gt %d ]; then' % stall_s,
              '      echo "rgt: dead-man: heartbeat ${age}s old (> %d s): stopping the job" >&2' % stall_s,
              '      echo "stalled ${age}s" > "$RGT_RUN_DIR/DEADMAN_FIRED"; %s; return' % stop_meter,
              "    fi",
              "  done",
              "}",
              'if [ "$rgt_rank" = 0 ]; then rgt_watch & rgt_watcher=$!; else rgt_watcher=""; fi']
    else:
        L += ['rgt_watcher=""']
    L += ["rgt_rc=0",
          "while :; do",
          '  wait "$rgt_step"; rgt_rc=$?',
          '  kill -0 "$rgt_step" 2>/dev/null || break',
          "done",
          '[ -z "$rgt_watcher" ] || kill "$rgt_watcher" 2>/dev/null',
          'echo "rgt: job exited with code $rgt_rc"']
    if slurm:
        L += ['if [ "$rgt_warned" = 1 ] && [ "$rgt_rc" != 0 ]; then',
              '  restarts=${SLURM_RESTART_COUNT:-0}',
              '  if [ "$restarts" -ge %d ]; then' % dm["max_restarts"],
              '    echo "rgt: dead-man: restart cap (%d) reached; not requeuing" >&2; exit "$rgt_rc"' % dm["max_restarts"],
              "  fi",
              '  if [ $(( $(date +%s) - rgt_first )) -ge "$rgt_cap" ]; then',
              '    echo "rgt: dead-man: wall-clock cap reached; not requeuing" >&2; exit "$rgt_rc"',
              "  fi",
              '  echo "rgt: checkpoint saved (newest: $(ls -1 "$RGT_CKPT_DIR" | tail -n1)); requeuing job $SLURM_JOB_ID"',
              '  scontrol requeue "$SLURM_JOB_ID" && exit 0',
              '  echo "rgt: scontrol requeue failed; resubmit this script to resume" >&2; exit "$rgt_rc"',
              "fi"]
    if req.get("toolkit_dir"):
        roster = " ".join("--roster %s" % q(g) for g in req["outputs"]["roster"])
        roster += "".join(" --allow-empty %s" % q(g) for g in req["outputs"].get("allow_empty", []))
        L += ['if [ "$rgt_rc" = 0 ] && [ "$rgt_rank" = 0 ]; then',
              '  python3 %s/build_pull_manifest.py --root "$RGT_RUN_DIR" --run-id "$RGT_RUN_ID" %s || rgt_rc=1'
              % (q(req["toolkit_dir"].rstrip("/")), roster),
              "fi"]
    L += ['exit "$rgt_rc"']
    return "\n".join(L) + "\n"


def launch_lines(req, target):
    res = req["resources"]
    cmd = " ".join(q(a) for a in req["command"]) + ' "${rgt_resume[@]}"'
    nproc = max(1, res["gpus_per_node"])
    if req["launcher"] == "none":
        inner = cmd
    elif target == "slurm":
        inner = ("torchrun --nnodes=\"$SLURM_NTASKS\" --nproc-per-node=%d --rdzv-backend=c10d "
                 "--rdzv-endpoint=\"$rgt_head:$rgt_port\" --rdzv-id=\"$RGT_RUN_ID-$SLURM_JOB_ID\" %s" % (nproc, cmd))
    elif target == "skypilot":
        inner = ("torchrun --nnodes=\"$SKYPILOT_NUM_NODES\" --nproc-per-node=%d --rdzv-backend=c10d "
                 "--rdzv-endpoint=\"$rgt_head:%d\" --rdzv-id=\"$RGT_RUN_ID\" %s" % (nproc, SKY_RDZV_PORT, cmd))
    elif target == "pytorchjob":
        inner = ("torchrun --nnodes=\"${WORLD_SIZE:-1}\" --nproc-per-node=%d --rdzv-backend=c10d "
                 "--rdzv-endpoint=\"${MASTER_ADDR:-localhost}:${MASTER_PORT:-23456}\" --rdzv-id=\"$RGT_RUN_ID\" %s"
                 % (nproc, cmd))
    elif res["nodes"] > 1:
        inner = ("torchrun --nnodes=%d --nproc-per-node=%d --rdzv-backend=c10d --rdzv-endpoint=%s-0.%s:%d "
                 "--rdzv-id=\"$RGT_RUN_ID\" %s" % (res["nodes"], nproc, req["name"], req["name"], K8S_RDZV_PORT, cmd))
    else:
        inner = "torchrun --standalone --nnodes=1 --nproc-per-node=%d %s" % (nproc, cmd)
    if target == "slurm":
        return ["# rendezvous: the batch shell runs on the first node of the allocation, which hosts the c10d store",
                'rgt_head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
                "rgt_port=$(( 20000 + ${SLURM_JOB_ID:-0} % 20000 ))",
                "while (exec 3<>\"/dev/tcp/127.0.0.1/$rgt_port\") 2>/dev/null; do rgt_port=$((rgt_port + 1)); done",
                'echo "rgt: rendezvous $rgt_head:$rgt_port"',
                "srun --kill-on-bad-exit=1 %s &" % inner,
                "rgt_step=$!"]
    if target == "skypilot":
        return ['rgt_head=$(echo "$SKYPILOT_NODE_IPS" | head -n1)', "%s &" % inner, "rgt_step=$!"]
    return ["%s &" % inner, "rgt_step=$!"]


# ---------------------------------------------------------------------------------- targets
def slurm_time(minutes):
    return "%d-%02d:%02d:00" % (minutes // 1440, minutes % 1440 // 60, minutes % 60) if minutes >= 1440 else \
        "%02d:%02d:00" % (minutes // 60, minutes % 60)


def render_slurm(req):
    res, ck = req["resources"], req["checkpoint"]
    logs = "%s/results/%s/logs" % (req["outputs"]["durable_dir"].rstrip("/"), req["run_id"])
    d = ["--job-name=%s" % req["name"], "--nodes=%d" % res["nodes"], "--ntasks-per-node=1",
         "--time=%s" % slurm_time(res["time_limit_minutes"]),
         "--signal=B:USR1@%d" % ck["warn_seconds"], "--requeue", "--open-mode=append",
         "--output=%s/slurm-%%j.out" % logs]
    if res["gpus_per_node"]:
        d.append("--gpus-per-node=%s%d" % (res["gpu_type"] + ":" if res.get("gpu_type") else "", res["gpus_per_node"]))
    if res.get("cpus_per_node"):
        d.append("--cpus-per-task=%d" % res["cpus_per_node"])
    if res.get("memory_gb"):
        d.append("--mem=%dG" % res["memory_gb"])
    for key in ("partition", "account"):
        if res.get(key):
            d.append("--%s=%s" % (key, res[key]))
    for line in d:   # one word each: sbatch reads an #SBATCH value up to the first blank
        if re.search(r"\s", line):
            raise core.UsageError("the Slurm directive %r would hold a blank; use a value without spaces" % line)
    head = ["#!/bin/bash"] + ["#SBATCH %s" % x for x in d] + [
        "# Rendered by render_job.py (remote-gpu-trainer) for run %s. Submit: sbatch THIS_FILE" % req["run_id"],
        "# The log dir must exist before sbatch opens the output file, so it is created at submit time too:",
        "# mkdir -p %s" % q(logs)]
    warnings = []
    if res.get("spot"):
        warnings.append("resources.spot has no Slurm meaning; ask the site for a preemptible partition")
    return "\n".join(head) + "\n" + entry_script(req, "slurm"), warnings


def k8s_env(req):
    return [{"name": "PYTHONUNBUFFERED", "value": "1"}]


def k8s_resources(req):
    res = req["resources"]
    limits, requests = {}, {}
    if res["gpus_per_node"]:
        limits["nvidia.com/gpu"] = res["gpus_per_node"]
    if res.get("cpus_per_node"):
        requests["cpu"] = str(res["cpus_per_node"])
    if res.get("memory_gb"):
        requests["memory"] = limits["memory"] = "%dGi" % res["memory_gb"]
    out = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def pod_spec(req, target, restart_policy):
    pvc = req["outputs"].get("pvc")
    if not pvc:
        raise core.UsageError("--to %s needs outputs.pvc: a container's own disk is lost when the pod goes" % target)
    if not req.get("image"):
        raise core.UsageError("--to %s needs image (pin it by digest)" % target)
    container = {
        "name": PTJ_CONTAINER if target == "pytorchjob" else "train",
        "image": req["image"],
        "workingDir": req["workdir"],
        "command": ["bash", "-c", entry_script(req, target)],
        "env": k8s_env(req),
        "volumeMounts": [{"name": "durable", "mountPath": req["outputs"]["durable_dir"]},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    resources = k8s_resources(req)
    if resources:
        container["resources"] = resources
    if target == "k8s-job" and req["resources"]["nodes"] > 1:
        container["ports"] = [{"containerPort": K8S_RDZV_PORT, "name": "rdzv"}]
    spec = {"restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": req["checkpoint"]["save_seconds"] + K8S_GRACE_MARGIN,
            "containers": [container],
            "volumes": [{"name": "durable", "persistentVolumeClaim": {"claimName": pvc["claim"]}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory"}}]}
    return spec


def labels(req):
    return {"app.kubernetes.io/name": req["name"], "app.kubernetes.io/managed-by": "render_job",
            "rgt-run-id": re.sub(r"[^A-Za-z0-9._-]", "-", req["run_id"])[:63]}


def pvc_doc(req):
    pvc = req["outputs"].get("pvc") or {}
    if not pvc.get("size_gb"):
        return []
    spec = {"accessModes": [pvc.get("access_mode", "ReadWriteMany" if req["resources"]["nodes"] > 1
                                    else "ReadWriteOnce")],
            "resources": {"requests": {"storage": "%dGi" % pvc["size_gb"]}}}
    if pvc.get("storage_class"):
        spec["storageClassName"] = pvc["storage_class"]
    return [{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": pvc["claim"], "labels": labels(req)}, "spec": spec}]


def render_k8s_job(req):
    nodes, dm = req["resources"]["nodes"], req["deadman"]
    pod = pod_spec(req, "k8s-job", "Never")
    spec = {"backoffLimit": dm["max_restarts"], "activeDeadlineSeconds": int(dm["max_hours"] * 3600),
            "template": {"metadata": {"labels": labels(req)}, "spec": pod}}
    docs = pvc_doc(req)
    if nodes > 1:
        spec.update(completions=nodes, parallelism=nodes, completionMode="Indexed")
        pod["subdomain"] = req["name"]
        docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": req["name"], "labels": labels(req)},
                     "spec": {"clusterIP": "None", "selector": {"app.kubernetes.io/name": req["name"]},
                              "ports": [{"name": "rdzv", "port": K8S_RDZV_PORT}]}})
    docs.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": req["name"], "labels": labels(req)},
                 "spec": spec})
    warnings = ["several pods: a failed pod is retried alone while the others wait at rendezvous; "
                "the pytorchjob target restarts the group"] if nodes > 1 else []
    return dump_yaml(docs), warnings


def render_pytorchjob(req):
    nodes, dm = req["resources"]["nodes"], req["deadman"]
    replica = {"replicas": 1, "restartPolicy": "OnFailure",
               "template": {"metadata": {"labels": labels(req)}, "spec": pod_spec(req, "pytorchjob", "OnFailure")}}
    replicas = {"Master": replica}
    if nodes > 1:
        replicas["Worker"] = dict(replica, replicas=nodes - 1)
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": req["name"], "labels": labels(req)},
           "spec": {"runPolicy": {"backoffLimit": dm["max_restarts"],
                                  "activeDeadlineSeconds": int(dm["max_hours"] * 3600), "cleanPodPolicy": "None"},
                    "pytorchReplicaSpecs": replicas}}
    return dump_yaml(pvc_doc(req) + [job]), []


def render_skypilot(req):
    res, out, dm = req["resources"], req["outputs"], req["deadman"]
    bucket = out.get("bucket")
    if not bucket:
        raise core.UsageError("--to skypilot needs outputs.bucket: a cluster's disks are deleted when it goes down")
    resources = {"use_spot": bool(res["spot"]),
                 "job_recovery": {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": dm["max_restarts"]},
                 "autostop": {"idle_minutes": dm["idle_minutes"], "down": True}}
    if res["gpus_per_node"]:
        if not res.get("gpu_type"):
            raise core.UsageError("--to skypilot needs resources.gpu_type when gpus_per_node > 0 (e.g. H100)")
        resources["accelerators"] = "%s:%d" % (res["gpu_type"], res["gpus_per_node"])
    if res.get("cpus_per_node"):
        resources["cpus"] = "%d+" % res["cpus_per_node"]
    if res.get("memory_gb"):
        resources["memory"] = "%d+" % res["memory_gb"]
    if req.get("image"):
        resources["image_id"] = "docker:%s" % req["image"]
    task = {"name": req["name"], "workdir": req["workdir"], "num_nodes": res["nodes"], "resources": resources,
            "file_mounts": {out["durable_dir"]: {"name": bucket["name"], "store": bucket["store"],
                                                 "mode": bucket.get("mode", "MOUNT_CACHED"), "persistent": True}},
            "envs": {"PYTHONUNBUFFERED": "1"},
            "run": entry_script(req, "skypilot")}
    warnings = ["launch with `sky jobs launch` for managed recovery; autostop applies to `sky launch` clusters"]
    return dump_yaml([task]), warnings


def dump_yaml(docs):
    yaml = need_yaml("YAML output")

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return "---\n".join(yaml.dump(d, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=4096)
                        for d in docs)


RENDER = {"slurm": render_slurm, "k8s-job": render_k8s_job, "pytorchjob": render_pytorchjob,
          "skypilot": render_skypilot}


def main(argv=None):
    parser = core.Parser(prog=PROG, description="Render a portable job request for Slurm, Kubernetes or SkyPilot.",
                         formatter_class=core.RawHelp, epilog=core.exit_codes_epilog(__doc__))
    parser.add_argument("request", help="the job request (JSON, or YAML with PyYAML)")
    parser.add_argument("--to", required=True, choices=TARGETS, help="the engine to render for")
    parser.add_argument("--out", help="write the rendering to this path instead of stdout")
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    args = parser.parse_args(argv)
    if args.out is not None:
        if not args.out:
            raise core.UsageError("--out is empty")
        if os.path.isdir(args.out):
            raise core.UsageError("--out %s is a directory" % args.out)
        parent = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(parent):
            raise core.UsageError("--out: %s is not a directory" % parent)
    req = load_request(args.request)
    text, warnings = RENDER[args.to](req)
    if args.out:
        try:
            core.atomic_write(args.out, text, mode=0o755 if args.to == "slurm" else 0o644)
        except OSError as exc:
            raise core.UsageError("--out %s: %s" % (args.out, exc))
    report = {"status": core.OK, "target": args.to, "run_id": req["run_id"], "out": args.out,
              "run_dir": "%s/results/%s" % (req["outputs"]["durable_dir"].rstrip("/"), req["run_id"]),
              "contract": ["RGT_RUN_ID", "RGT_RUN_DIR", "RGT_HEARTBEAT", "RGT_CKPT_DIR", "RGT_ATTEMPT",
                           "RGT_RESUME_FROM"],
              "stop_signal": "SIG" + req["checkpoint"]["stop_signal"], "warnings": warnings}
    if args.json:
        if not args.out:
            report["text"] = text
        core.emit_json(report)
    elif args.out:
        print("%s %s: %s written for run %s" % (core.OK, args.to, args.out, req["run_id"]))
        for w in warnings:
            print("WARN %s" % w)
    else:
        sys.stdout.write(text)
    return core.EXIT_OK


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog=PROG))
