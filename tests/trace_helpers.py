"""What the on-demand profile tests read from a jax.profiler trace."""

from jax.profiler import ProfileData


def traced_steps(xplane: bytes) -> list[int]:
  """The train steps (jax.profiler.StepTraceAnnotation("train", step_num=N)) a trace's
  XSpace holds, in order."""
  steps = []
  for plane in ProfileData.from_serialized_xspace(xplane).planes:
    for line in plane.lines:
      steps += [dict(e.stats)["step_num"] for e in line.events if e.name == "train"]
  return sorted(steps)
