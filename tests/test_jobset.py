"""`cardjax jobset`: the JobSet manifests for TPU slices and GPU node pools, checked offline
against Kubernetes' schema (the Job and pod parts, strictly: an unknown or misspelt field
fails) and JobSet's v1alpha2 API (every field known, every type right); the committed
examples in launch/k8s/ are what the command writes; bad input is one clear error."""


import kubernetes_validate
import pytest
import yaml
from kubeflow_trainer_api.models import jobset_v1alpha2_job_set as jobset_api
from launch_helpers import ROOT
from pydantic import BaseModel

from cardjax.cli import main
from cardjax.jobset import manifest

K8S_VERSION = "1.33"
EXAMPLES = {  # launch/k8s/FILE: the command line that wrote it
    "jobset_tpu_v5p-128.yaml": ["--name", "card1b", "--topology", "v5p-128", "--image",
                                "REGION-docker.pkg.dev/PROJECT/REPO/cardjax:latest",
                                "--workdir", "gs://BUCKET/runs/card1b", "--", "train",
                                "--config", "card_1b"],
    "jobset_gpu_16xH100.yaml": ["--name", "mars7b", "--topology", "16xH100", "--image",
                                "REGION-docker.pkg.dev/PROJECT/REPO/cardjax:latest",
                                "--workdir", "gs://BUCKET/runs/mars7b", "--", "train",
                                "--config", "mars_qwen2_5_7b:mars",
                                "--config.train.init_from=gs://BUCKET/Qwen2.5-7B-Instruct"],
}


def _known_fields(model: type[BaseModel], value, where: str) -> None:
  """Every key of `value` is a field of `model` (the generated models ignore unknown keys),
  recursively through the JobSet's own objects; Kubernetes' objects are checked below."""
  if not isinstance(value, dict):
    return
  fields = {f.alias or name: f for name, f in model.model_fields.items()}
  unknown = set(value) - set(fields)
  assert not unknown, f"{where}: {sorted(unknown)} are not fields of {model.__name__}"
  for key, item in value.items():
    annotation = fields[key].annotation
    inner = [a for a in getattr(annotation, "__args__", (annotation,)) if a is not type(None)]
    inner = [getattr(a, "__args__", (a,))[0] for a in inner]  # List[X] -> X
    for sub in inner:
      if isinstance(sub, type) and issubclass(sub, BaseModel) and \
         sub.__name__.startswith("Jobset"):
        for i, element in enumerate(item if isinstance(item, list) else [item]):
          _known_fields(sub, element, f"{where}.{key}[{i}]")


def check_manifest(doc: dict) -> None:
  assert doc["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and doc["kind"] == "JobSet"
  jobset_api.JobsetV1alpha2JobSet.from_dict(doc)  # types and required fields
  _known_fields(jobset_api.JobsetV1alpha2JobSet, doc, "JobSet")
  for rjob in doc["spec"]["replicatedJobs"]:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": rjob["name"]},
           "spec": rjob["template"]["spec"]}
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def _written(args, tmp_path) -> dict:
  out = tmp_path / "jobset.yaml"
  assert main(["jobset", *args[:args.index("--")], "--output", str(out),
               *args[args.index("--"):]]) == 0
  return yaml.safe_load(out.read_text())


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_committed_examples_are_what_the_command_writes_and_validate(name, tmp_path):
  committed = yaml.safe_load((ROOT / "launch" / "k8s" / name).read_text())
  assert committed == _written(EXAMPLES[name], tmp_path), (
      f"launch/k8s/{name} is out of date: rewrite it with the command in its first line")
  check_manifest(committed)


@pytest.mark.parametrize("topology,slices,hosts,per_host", [
    ("v5p-128", 1, 16, 4), ("2xv5p-256", 2, 32, 4), ("v6e-8", 1, 1, 8), ("v6e-64", 1, 16, 4),
    ("v4-32", 1, 4, 4), ("8xH200", 1, 1, 8), ("32xA100", 1, 4, 8)])
def test_each_topology_gives_its_hosts_and_validates(topology, slices, hosts, per_host):
  doc = manifest("run", topology, "img", ["train", "--config", "tiny_ar"], "gs://b/run")
  check_manifest(doc)
  [rjob] = doc["spec"]["replicatedJobs"]
  job = rjob["template"]["spec"]
  assert (rjob["replicas"], job["parallelism"], job["completions"]) == (slices, hosts, hosts)
  [container] = job["template"]["spec"]["containers"]
  assert list(container["resources"]["limits"].values()) == [per_host]
  env = {e["name"]: e.get("value") for e in container["env"]}
  if not topology.upper().endswith(("H100", "H200", "A100")):
    assert env["CARDJAX_DISTRIBUTED"] == "auto"
    assert ("MEGASCALE_NUM_SLICES" in env) == (slices > 1)
  else:
    assert env["CARDJAX_COORDINATOR"] == "run-hosts-0-0.run:8476"
    assert env["CARDJAX_NUM_PROCESSES"] == str(hosts)
  assert container["command"][:5] == ["cardjax", "train", "--config", "tiny_ar", "--workdir"]
  assert "--config.train.compilation_cache_dir=gs://b/run/xla_cache" in container["command"]


def test_a_misspelt_field_fails_the_check():
  doc = manifest("run", "v5p-128", "img", ["train"], "gs://b/run")
  doc["spec"]["failurePolicy"]["maxRestart"] = 3
  with pytest.raises(AssertionError, match="maxRestart"):
    check_manifest(doc)
  doc = manifest("run", "v5p-128", "img", ["train"], "gs://b/run")
  doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["restartPolicy"] = 3
  with pytest.raises(Exception):
    check_manifest(doc)


@pytest.mark.parametrize("args,message", [
    (["--workdir", "/local/run"], "share no disk"),
    (["--name", "Bad_Name"], "DNS label"),
    (["--topology", "v9-8"], "unknown TPU generation"),
    (["--restarts", "-1"], "--restarts must be"),
])
def test_bad_input_is_one_clear_error(args, message, capsys):
  base = {"--name": "run", "--topology": "v5p-128", "--image": "img", "--workdir": "gs://b/r"}
  base.update(dict(zip(args[::2], args[1::2])))
  argv = ["jobset", *[x for kv in base.items() for x in kv], "--", "train", "--config", "x"]
  assert main(argv) == 2
  err = capsys.readouterr().err
  assert message in err and err.count("\n") == 1, err
