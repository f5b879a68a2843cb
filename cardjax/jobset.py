"""Kubernetes JobSet manifests for a cardjax job: one TPU slice or several on GKE, or a GPU
node pool (`cardjax jobset`, docs/pods.md).

One template serves both: a JobSet with one replicated Job per TPU slice (one in all on
GPUs), an indexed Job of one pod per host, every pod running the same cardjax command.
- **Restarts**: a pod that fails fails its Job (backoffLimit 0), and the JobSet controller
  recreates every Job, up to `restarts` times; the run resumes from its newest checkpoint.
  Exit status 2 (an error the user must fix) fails the JobSet instead; 143 (preempted, every
  host saved the same step) restarts without using up a restart, since a multi-day run meets
  many preemptions. Both through the Job's podFailurePolicy, whose message names the rule
  that matched, and the JobSet's rules on that message.
- **Meeting**: on TPUs JAX finds the slice from the variables GKE gives each pod
  (CARDJAX_DISTRIBUTED=auto); on GPUs process 0's pod is the coordinator, reached by its
  name under the JobSet's headless service (`NAME-hosts-0-0.NAME`), and each pod's process
  index is its Job completion index.
- **State on a bucket**: --workdir must be gs:// or s3:// (pods share no disk); the XLA
  compilation cache goes to a bucket too, so a restarted job loads its compiled step.
- **SIGTERM**: terminationGracePeriodSeconds leaves the hosts time to agree on a step and
  save it before Kubernetes kills them.
- **The attempt**: CARDJAX_ATTEMPT is the JobSet's restart count (its pod annotation).
Several TPU slices meet over DCN through libtpu's megascale variables, set here as xpk sets
them; that path has not yet run on a real multi-slice cluster.
"""

from __future__ import annotations

from cardjax.errors import CardjaxError
from cardjax.plan.targets import parse_target
from cardjax.storage import is_remote
from cardjax.train import exit_codes

API_VERSION = "jobset.x-k8s.io/v1alpha2"
CONTAINER = "cardjax"
COORDINATOR_PORT = 8476
# GKE node labels (cloud.google.com/gke-tpu-accelerator, cloud.google.com/gke-accelerator).
TPU_ACCELERATORS = {"v4": "tpu-v4-podslice", "v5e": "tpu-v5-lite-podslice",
                    "v5p": "tpu-v5p-slice", "v6e": "tpu-v6e-slice"}
GPU_ACCELERATORS = {"H100": "nvidia-h100-80gb", "H200": "nvidia-h200-141gb",
                    "A100": "nvidia-tesla-a100"}
TPU_CHIPS_PER_HOST = 4  # a multi-host slice's VMs; a single-host v5e/v6e slice has up to 8
GPUS_PER_NODE = 8


def _shape(topology: str) -> dict:
  """Slices, hosts per slice, chips per host and node labels for a `cardjax plan` name."""
  target = parse_target(topology, estimate=True)
  if target.platform == "tpu":
    per_slice = target.chips // target.slices
    per_host = min(per_slice, 8 if target.chip in ("v5e", "v6e") and per_slice <= 8
                   else TPU_CHIPS_PER_HOST)
    return {"platform": "tpu", "slices": target.slices, "hosts": per_slice // per_host,
            "per_host": per_host, "resource": "google.com/tpu",
            "selector": {"cloud.google.com/gke-tpu-accelerator": TPU_ACCELERATORS[target.chip],
                         "cloud.google.com/gke-tpu-topology":
                             target.libtpu_topology.split(":")[1]}}
  per_host = min(target.chips, GPUS_PER_NODE)
  return {"platform": "gpu", "slices": 1, "hosts": target.chips // per_host,
          "per_host": per_host, "resource": "nvidia.com/gpu",
          "selector": {"cloud.google.com/gke-accelerator": GPU_ACCELERATORS[target.chip]}}


def manifest(name: str, topology: str, image: str, command: list[str], workdir: str,
             compilation_cache: str = "", restarts: int = 10,
             grace_seconds: int = 300) -> dict:
  """The JobSet (a dict, for YAML) that runs `cardjax COMMAND --workdir WORKDIR` on every
  host of `topology` (v5p-128, 2xv5p-256, 16xH100, ...)."""
  if not is_remote(workdir):
    raise CardjaxError(f"--workdir {workdir!r}: the pods of a JobSet share no disk; use a "
                       "bucket, gs://BUCKET/PATH or s3://BUCKET/PATH")
  if compilation_cache and not is_remote(compilation_cache):
    raise CardjaxError(f"--compilation-cache {compilation_cache!r}: use a bucket path, as "
                       "for --workdir")
  if restarts < 0 or grace_seconds < 1:
    raise CardjaxError("--restarts must be >= 0 and --grace-seconds >= 1")
  if not command or command[0] != "train":
    raise CardjaxError(f"the JobSet's command must be `train ...`; got {' '.join(command)!r}")
  shape = _shape(topology)
  cache = compilation_cache or workdir.rstrip("/") + "/xla_cache"
  args = ["cardjax", *command, "--workdir", workdir,
          f"--config.train.compilation_cache_dir={cache}", "--config.train.progress=false"]
  env = [{"name": "CARDJAX_ATTEMPT", "valueFrom": {"fieldRef": {
      "fieldPath": "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']"}}}]
  hosts = shape["hosts"]
  if shape["platform"] == "tpu":
    env.append({"name": "CARDJAX_DISTRIBUTED", "value": "auto"})
    if shape["slices"] > 1:  # slices over DCN meet through libtpu's megascale runtime
      env += [{"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": f"{name}-hosts-0-0.{name}"},
              {"name": "MEGASCALE_NUM_SLICES", "value": str(shape["slices"])},
              {"name": "MEGASCALE_SLICE_ID", "valueFrom": {"fieldRef": {
                  "fieldPath": "metadata.annotations['jobset.sigs.k8s.io/job-index']"}}}]
  else:
    env += [{"name": "CARDJAX_COORDINATOR",
             "value": f"{name}-hosts-0-0.{name}:{COORDINATOR_PORT}"},
            {"name": "CARDJAX_NUM_PROCESSES", "value": str(hosts)},
            {"name": "CARDJAX_PROCESS_ID", "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}]
  resources = {shape["resource"]: shape["per_host"]}
  container = {"name": CONTAINER, "image": image, "command": args, "env": env,
               "resources": {"limits": dict(resources), "requests": dict(resources)},
               "ports": [{"containerPort": COORDINATOR_PORT}],
               "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}
  pod = {"metadata": {"labels": {"app": name}},
         "spec": {"restartPolicy": "Never", "nodeSelector": shape["selector"],
                  "terminationGracePeriodSeconds": grace_seconds,
                  "containers": [container],
                  "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]}}
  exit_rules = [{"action": "FailJob", "onExitCodes": {
      "containerName": CONTAINER, "operator": "In", "values": [code]}}
      for code in (exit_codes.USER_ERROR, exit_codes.PREEMPTED)]
  job = {"backoffLimit": 0, "completionMode": "Indexed", "completions": hosts,
         "parallelism": hosts, "podFailurePolicy": {"rules": exit_rules}, "template": pod}
  return {
      "apiVersion": API_VERSION, "kind": "JobSet",
      "metadata": {"name": name, "labels": {"app": name}},
      "spec": {
          "network": {"enableDNSHostnames": True, "subdomain": name},
          "failurePolicy": {"maxRestarts": restarts, "rules": [
              # Kubernetes names the podFailurePolicy rule that failed the Job.
              {"name": "user-error", "action": "FailJobSet",
               "onJobFailureReasons": ["PodFailurePolicy"],
               "onJobFailureMessagePatterns": [".*matching FailJob rule at index 0.*"]},
              {"name": "preempted", "action": "RestartJobSetAndIgnoreMaxRestarts",
               "onJobFailureReasons": ["PodFailurePolicy"],
               "onJobFailureMessagePatterns": [".*matching FailJob rule at index 1.*"]}]},
          "replicatedJobs": [{"name": "hosts", "replicas": shape["slices"],
                              "template": {"spec": job}}]}}
