"""`cardjax jobset --name N --topology T --image I --workdir gs://B/P -- train --config F
[--config.k=v ...]`: print (or write) a Kubernetes JobSet manifest that runs the job on a
GKE TPU slice or GPU node pool, restarting it on preemption, stalls and lost hosts
(cardjax/jobset.py, docs/pods.md)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p) -> None:
  p.add_argument("--name", required=True, help="the JobSet's name (a DNS label: a-z, 0-9, -)")
  p.add_argument("--topology", required=True,
                 help="as for `cardjax plan`: v5p-128, 2xv5p-256 (two slices), v6e-64, 16xH100")
  p.add_argument("--image", required=True, help="a container image with cardjax installed")
  p.add_argument("--workdir", required=True, help="the run folder, on a bucket (gs://, s3://)")
  p.add_argument("--compilation-cache", default="",
                 help="XLA's compilation cache on a bucket (default: WORKDIR/xla_cache)")
  p.add_argument("--restarts", type=int, default=10,
                 help="restarts after a stall, a crash or a lost host (preemptions do not "
                      "count); default 10")
  p.add_argument("--grace-seconds", type=int, default=300,
                 help="terminationGracePeriodSeconds: time to save after SIGTERM (300)")
  p.add_argument("--output", default="-", help="the YAML file to write (default: stdout)")
  p.add_argument("job", nargs=argparse.REMAINDER,
                 help="after --: the cardjax command each host runs, e.g. train --config "
                      "configs/card_1b.py")


def run(args) -> int:
  import re

  import yaml

  from cardjax.errors import CardjaxError
  from cardjax.jobset import manifest

  if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?", args.name):
    raise CardjaxError(f"--name {args.name!r}: a JobSet name is a DNS label of at most 40 "
                       "characters (a-z, 0-9 and -, letters or digits at both ends)")
  job = [a for a in args.job if a != "--"] + list(args.overrides)
  text = yaml.safe_dump(manifest(args.name, args.topology, args.image, job, args.workdir,
                                 args.compilation_cache, args.restarts, args.grace_seconds),
                        sort_keys=False, width=100)
  flags = [f"--name {args.name}", f"--topology {args.topology}", f"--image {args.image}",
           f"--workdir {args.workdir}"]
  flags += [f"--compilation-cache {args.compilation_cache}"] * bool(args.compilation_cache)
  flags += [f"--restarts {args.restarts}"] * (args.restarts != 10)
  flags += [f"--grace-seconds {args.grace_seconds}"] * (args.grace_seconds != 300)
  header = (f"# Written by: cardjax jobset {' '.join(flags)} --output {args.output} -- "
            f"{' '.join(job)}\n# Apply with: kubectl apply -f {args.output}\n")
  if args.output == "-":
    sys.stdout.write(text)
  else:
    with open(args.output, "w") as f:
      f.write(header + text)
    print(f"wrote {args.output}: kubectl apply -f {args.output}")
  return 0
