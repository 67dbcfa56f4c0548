"""scripts/render_job.py: one job request, four engine renderings, each checked by the engine's own tooling where
it can be: a real single-node Slurm runs the sbatch script through a time-limit warning, a checkpoint, a requeue and
a resume; the Kubernetes manifests validate against a named Kubernetes version's schema; the SkyPilot task loads with
SkyPilot's parser when it is installed. Every rendering is also checked structurally here."""
import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from conftest import NODE, REPO, missing, need, need_module, need_root
from render_fixture import SCHEMA, render, request

K8S_VERSION = "1.33.0"  # the Kubernetes version the manifests are validated against (schemas in kubernetes-validate)
sys.path.insert(0, str(REPO / "scripts"))
import render_job  # noqa: E402

CONTRACT = ("RGT_RUN_ID", "RGT_RUN_DIR", "RGT_HEARTBEAT", "RGT_CKPT_DIR", "RGT_ATTEMPT", "RGT_RESUME_FROM")


def yaml_docs(text):
    yaml = need_module("yaml")
    return [d for d in yaml.safe_load_all(text) if d is not None]


# ---------------------------------------------------------------- the request and its schema

def test_schema_is_valid_and_accepts_the_example(tmp_path):
    jsonschema = need_module("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(json.loads(request(tmp_path).read_text()), schema)


@pytest.mark.parametrize("bad,fragment", [
    ({"name": "Bad_Name"}, "request.name"),
    ({"resources": {"nodes": 0}}, "request.resources.nodes must be >= 1"),
    ({"outputs": {"roster": []}}, "request.outputs.roster needs at least 1"),
    ({"checkpoint": {"stop_signal": "KILL"}}, "request.checkpoint.stop_signal must be one of"),
    ({"colour": "blue"}, "request.colour is not a known field"),
    ({"command": None}, "request.command is required"),
])
def test_the_renderer_and_jsonschema_agree_on_bad_requests(tmp_path, bad, fragment):
    jsonschema = need_module("jsonschema")
    path = request(tmp_path, **bad)
    res = render(path, "slurm", check=False)
    assert res.returncode == 2 and fragment in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(path.read_text()), json.loads(SCHEMA.read_text()))


def test_yaml_request_is_read(tmp_path):
    yaml = need_module("yaml")
    src = tmp_path / "job.yaml"
    src.write_text(yaml.safe_dump(json.loads(request(tmp_path).read_text())))
    assert "#SBATCH --requeue" in render(src, "slurm").stdout


# ---------------------------------------------------------------- sbatch: structure

def test_sbatch_carries_the_contract(tmp_path):
    text = render(request(tmp_path), "slurm").stdout
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=H100:8",
                 "#SBATCH --time=12:00:00", "#SBATCH --signal=B:USR1@210", "#SBATCH --requeue",
                 "#SBATCH --output=/shared/rgt/results/drill/logs/slurm-%j.out", "--rdzv-backend=c10d",
                 'scontrol requeue "$SLURM_JOB_ID"', "trap rgt_warn USR1", "--nproc-per-node=8"):
        assert line in text, line
    for name in CONTRACT:
        assert name in text
    assert 'rgt_resume=(--resume \'\'"$RGT_RESUME_FROM"\'\')' in text
    res = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert res.returncode == 0, res.stderr


def test_sbatch_passes_shellcheck(tmp_path):
    shellcheck = need("shellcheck")
    out = tmp_path / "job.sbatch"
    render(request(tmp_path), "slurm", "--out", str(out))
    res = subprocess.run([shellcheck, "-S", "warning", str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


# ---------------------------------------------------------------- sbatch: a real Slurm runs it

TRAINER = r'''#!/usr/bin/env python3
"""Tiny DDP job on CPU (gloo): saves on SIGTERM, resumes from $RGT_RESUME_FROM, writes final.json."""
import json, os, signal, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

total = int(sys.argv[1])
ckpt_dir, run_dir = os.environ["RGT_CKPT_DIR"], os.environ["RGT_RUN_DIR"]
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
ddp = DDP(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step, resumed = 0, 0
latest = os.environ.get("RGT_RESUME_FROM") or ""
if latest:
    state = torch.load(latest)
    model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"]); step = resumed = state["step"]
print("rank %d/%d attempt %s start at step %d from %r" % (rank, world, os.environ["RGT_ATTEMPT"], step, latest),
      flush=True)
slow = float(os.environ.get("SLOW_S", "0")) if os.environ["RGT_ATTEMPT"] == "1" else 0.0

def save(name):
    if rank == 0:
        tmp = os.path.join(ckpt_dir, "." + name + ".tmp")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
        os.replace(tmp, os.path.join(ckpt_dir, name))
    dist.barrier()

while step < total:
    flag = torch.tensor([float(bool(stop))])
    dist.all_reduce(flag)
    if flag.item() > 0:
        save("ckpt-%08d.pt" % step)
        print("rank %d saved on signal at step %d" % (rank, step), flush=True)
        dist.destroy_process_group()
        sys.exit(143)
    loss = ddp(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step(); step += 1
    if rank == 0:
        with open(os.environ["RGT_HEARTBEAT"] + ".tmp", "w") as f:
            json.dump({"step": step, "total_steps": total, "time": time.time()}, f)
        os.replace(os.environ["RGT_HEARTBEAT"] + ".tmp", os.environ["RGT_HEARTBEAT"])
    time.sleep(slow)
save("ckpt-%08d.pt" % step)
if rank == 0:
    with open(os.path.join(run_dir, "final.json"), "w") as f:
        json.dump({"steps": step, "world": world, "resumed_from": resumed}, f)
dist.destroy_process_group()
'''


@pytest.mark.long
@pytest.mark.timeout(900)
def test_slurm_warns_checkpoints_requeues_and_resumes(tmp_path):
    """The rendered script on a real slurmctld + slurmd: USR1 before the 2-minute limit -> the job saves ->
    the script requeues it -> attempt 2 resumes from that checkpoint and finishes; two tasks on one node stand in
    for two nodes, so torchrun's c10d rendezvous forms a world of 2. Deadlines are generous; nothing is timed."""
    for program in ("slurmctld", "slurmd", "munged", "sbatch"):
        need(program)
    need_module("torch")
    need_root("the single-node Slurm fixture (its daemons run as root)")
    from slurm_fixture import SlurmCluster

    code = tmp_path / "code"
    code.mkdir()
    (code / "trainer.py").write_text(TRAINER)
    durable = tmp_path / "durable"
    # attempt 1 sleeps 0.25 s a step (200 s of steps), so the warning 20 s before the 2-minute limit always comes
    # first; attempt 2 runs flat out and has a whole 2 minutes even on a loaded box (torch import, rendezvous)
    total = 800
    req = request(tmp_path, name="cpu-drill", command=["trainer.py", str(total)], workdir=str(code), image=None,
                  env={"SLOW_S": "0.25", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
                  resources={"nodes": 1, "gpus_per_node": 0, "cpus_per_node": 1, "memory_gb": None,
                             "gpu_type": None, "time_limit_minutes": 2},
                  outputs={"durable_dir": str(durable), "roster": ["final.json", "ckpt/ckpt-*.pt"], "pvc": None,
                           "bucket": None},
                  checkpoint={"save_seconds": 5, "warn_seconds": 20, "resume_args": []},
                  deadman={"max_restarts": 2, "max_hours": 1, "stall_minutes": 5},
                  toolkit_dir=str(NODE))
    script = tmp_path / "job.sbatch"
    render(req, "slurm", "--out", str(script))
    run_dir = durable / "results" / "cpu-drill"
    (run_dir / "logs").mkdir(parents=True)
    with SlurmCluster(tmp_path) as slurm:
        env = dict(slurm.env, PATH=os.path.dirname(sys.executable) + os.pathsep + slurm.env.get("PATH", ""))
        slurm.env = env
        # two tasks on the one node stand in for two nodes (command-line options override #SBATCH lines)
        job = slurm.run(["sbatch", "--parsable", "--ntasks-per-node=2", str(script)]).stdout.strip().split(";")[0]
        end = time.monotonic() + 480
        state = ""
        while time.monotonic() < end:
            state = slurm.job_field(job, "JobState")
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                break
            time.sleep(1)
        restarts = slurm.job_field(job, "Restarts")
        log = "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("slurm-*.out")))
        shown = "state %s restarts %s\n--- job log\n%s\n%s" % (state, restarts, log[-6000:], slurm.logs(1500))
        assert state == "COMPLETED", shown
    assert restarts == "1", shown
    assert "time-limit warning" in log and "requeuing job %s" % job in log, shown
    saved = [int(line.rsplit(" ", 1)[1]) for line in log.splitlines() if "rank 0 saved on signal at step" in line]
    assert len(saved) == 1 and 0 < saved[0] < total, shown
    ckpt = "%s/ckpt/ckpt-%08d.pt" % (run_dir, saved[0])
    assert "rank 0/2 attempt 2 start at step %d from %r" % (saved[0], ckpt) in log, shown
    assert "rank 1/2 attempt 2 start at step %d" % saved[0] in log, shown
    final = json.loads((run_dir / "final.json").read_text())
    assert final == {"steps": total, "world": 2, "resumed_from": saved[0]}, shown
    assert len((run_dir / "attempts").read_text().split()) == 2
    manifest = json.loads((run_dir / "PULL_MANIFEST.json").read_text())
    assert "final.json" in json.dumps(manifest), manifest


# ---------------------------------------------------------------- Kubernetes

def validate_k8s(docs, tmp_path):
    """Validate with kubernetes-validate for K8S_VERSION (offline: the schemas ship in the wheel)."""
    kv = need_module("kubernetes_validate", "pip install -r requirements-dev.txt (kubernetes-validate)")
    for doc in docs:
        kv.validate(doc, K8S_VERSION, strict=True)


def test_k8s_job_validates_and_carries_the_contract(tmp_path):
    docs = yaml_docs(render(request(tmp_path), "k8s-job").stdout)
    kinds = [d["kind"] for d in docs]
    assert kinds == ["PersistentVolumeClaim", "Service", "Job"]
    job = docs[-1]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["backoffLimit"] == 2 and spec["activeDeadlineSeconds"] == 48 * 3600
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] == 90 + 30
    box = pod["containers"][0]
    assert box["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert {"name": "durable", "mountPath": "/shared/rgt"} in box["volumeMounts"]
    assert {"name": "durable", "persistentVolumeClaim": {"claimName": "rgt-results"}} in pod["volumes"]
    assert docs[0]["spec"]["accessModes"] == ["ReadWriteMany"]
    entry = box["command"][2]
    assert "drill-0.drill:29400" in entry and all(n in entry for n in CONTRACT)
    assert subprocess.run(["bash", "-n"], input=entry, text=True).returncode == 0
    validate_k8s(docs, tmp_path)


def test_pytorchjob_validates_and_carries_the_contract(tmp_path):
    docs = yaml_docs(render(request(tmp_path), "pytorchjob").stdout)
    job = docs[-1]
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    reps = job["spec"]["pytorchReplicaSpecs"]
    assert reps["Master"]["replicas"] == 1 and reps["Worker"]["replicas"] == 1
    assert job["spec"]["runPolicy"]["backoffLimit"] == 2
    for rep in reps.values():
        pod = rep["template"]["spec"]
        assert rep["restartPolicy"] == "OnFailure" and pod["terminationGracePeriodSeconds"] == 120
        assert pod["containers"][0]["name"] == "pytorch"
        assert "--rdzv-endpoint=\"${MASTER_ADDR:-localhost}:${MASTER_PORT:-23456}\"" in pod["containers"][0]["command"][2]
    # The CRD is not in the Kubernetes schema: validate each replica's pod template as a core PodTemplate.
    templates = [{"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": rep["template"]}
                 for rep in reps.values()]
    validate_k8s(docs[:-1] + templates, tmp_path)


def test_k8s_refuses_without_a_volume_or_an_image(tmp_path):
    res = render(request(tmp_path, outputs={"pvc": None}), "k8s-job", check=False)
    assert res.returncode == 2 and "needs outputs.pvc" in res.stderr
    res = render(request(tmp_path, image=None), "pytorchjob", check=False)
    assert res.returncode == 2 and "needs image" in res.stderr


def test_kubernetes_validation_can_fail(tmp_path):
    docs = yaml_docs(render(request(tmp_path), "k8s-job").stdout)
    docs[-1]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "soon"
    kv = need_module("kubernetes_validate", "pip install -r requirements-dev.txt (kubernetes-validate)")
    with pytest.raises(kv.ValidationError):
        kv.validate(docs[-1], K8S_VERSION, strict=True)


# ---------------------------------------------------------------- SkyPilot

def test_skypilot_task_structure(tmp_path):
    docs = yaml_docs(render(request(tmp_path), "skypilot").stdout)
    assert len(docs) == 1
    task = docs[0]
    res = task["resources"]
    assert task["num_nodes"] == 2 and res["accelerators"] == "H100:8"
    assert res["job_recovery"] == {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 2}
    assert res["autostop"] == {"idle_minutes": 15, "down": True}
    assert task["file_mounts"]["/shared/rgt"]["name"] == "rgt-results-x"
    assert task["file_mounts"]["/shared/rgt"]["mode"] == "MOUNT_CACHED"
    assert all(n in task["run"] for n in CONTRACT) and "SKYPILOT_NODE_IPS" in task["run"]
    assert subprocess.run(["bash", "-n"], input=task["run"], text=True).returncode == 0
    res = render(request(tmp_path, outputs={"bucket": None}), "skypilot", check=False)
    assert res.returncode == 2 and "needs outputs.bucket" in res.stderr


SKY_PARSE = ("import json, sys, sky; task = sky.Task.from_yaml(sys.argv[1]); "
             "print(json.dumps({'num_nodes': task.num_nodes, 'run': task.run}))")


def test_skypilot_parser_loads_the_task(tmp_path):
    """SkyPilot itself parses the rendered task. Its interpreter: RGT_SKY_PYTHON (.ci/run keeps skypilot in a venv
    of its own, as it pins click<8.2 and wandb in requirements-dev.txt needs click>=8.2), else this one."""
    out = tmp_path / "task.yaml"
    render(request(tmp_path, workdir=str(tmp_path)), "skypilot", "--out", str(out))
    exe = os.environ.get("RGT_SKY_PYTHON") or sys.executable
    res = subprocess.run([exe, "-c", SKY_PARSE, str(out)], capture_output=True, text=True, timeout=300)
    if res.returncode != 0 and "No module named 'sky'" in res.stderr:
        missing("SkyPilot is not installed for %s (python3 -m venv --system-site-packages VENV && VENV/bin/pip "
                "install skypilot==0.14.1, then RGT_SKY_PYTHON=VENV/bin/python; .ci/run does this)" % exe)
    assert res.returncode == 0, res.stderr[-3000:]
    task = json.loads(res.stdout.strip().splitlines()[-1])
    assert task["num_nodes"] == 2
    assert "RGT_RESUME_FROM" in task["run"]


# ---------------------------------------------------------------- the CLI

def test_json_report_and_out_file(tmp_path):
    out = tmp_path / "job.sbatch"
    res = render(request(tmp_path), "slurm", "--out", str(out), "--json")
    report = json.loads(res.stdout)
    assert report["status"] == "OK" and report["out"] == str(out) and report["contract"] == list(CONTRACT)
    assert report["run_dir"] == "/shared/rgt/results/drill" and os.access(out, os.X_OK)
    report = json.loads(render(request(tmp_path), "skypilot", "--json").stdout)
    assert "text" in report and report["warnings"]


def test_entry_finds_the_newest_good_checkpoint(tmp_path):
    """The resume block alone, run by bash: temp, corrupt and empty files are never picked."""
    req = render_job.normalise(json.loads(request(tmp_path).read_text()))
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    (ckdir / "ckpt-00000010.pt").write_bytes(b"x")
    (ckdir / "ckpt-00000020.pt").write_bytes(b"")
    (ckdir / "ckpt-00000030.pt.tmp").write_bytes(b"x")
    (ckdir / "ckpt-00000040.pt.corrupt").write_bytes(b"x")
    script = render_job.entry_script(req, "slurm")
    block = script[script.index("RGT_RESUME_FROM=''"):script.index('echo "rgt: run')]
    res = subprocess.run(["bash", "-c", "RGT_CKPT_DIR=%s\n%s\necho \"$RGT_RESUME_FROM|${rgt_resume[*]}\""
                          % (shlex.quote(str(ckdir)), block)], capture_output=True, text=True)
    assert res.stdout.strip() == "%s/ckpt-00000010.pt|--resume %s/ckpt-00000010.pt" % (ckdir, ckdir), res.stderr


# ---------------------------------------------------------------- laptop round 4 findings (issue 28)


# ---------------------------------------------------------------- laptop 7: render_job pastes request text raw

@pytest.mark.parametrize("target", ["slurm", "k8s-job", "pytorchjob", "skypilot"])
@pytest.mark.parametrize("bad", [
    {"resources": {"partition": "gpu\ntouch PWNED_PARTITION"}},
    {"resources": {"account": "lab\ntouch PWNED_ACCOUNT"}},
    {"env": {"X=1; touch PWNED_ENVKEY; Y": "v"}},
    {"env": {"OK": "v\ntouch PWNED_ENVVAL"}},
    {"outputs": {"durable_dir": "/mnt/my data"}},
], ids=["partition", "account", "env-key", "env-value-newline", "durable-dir-blank"])
def test_finding_laptop_7_render_job_refuses_text_that_would_run_as_shell(tmp_path, target, bad):
    from render_fixture import SCHEMA, render, request
    path = request(tmp_path, **bad)
    res = render(path, target, check=False)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stdout + res.stderr
    assert "PWNED" not in res.stdout and "Traceback" not in res.stderr
    try:
        import jsonschema
    except ImportError:
        return
    if "OK" in bad.get("env", {}):
        return   # a newline in an env value is the renderer's check; the schema pins names and #SBATCH words
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(path.read_text()), json.loads(SCHEMA.read_text()))
