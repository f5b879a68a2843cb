"""How `cardjax train` ends, as its exit status: what the launchers (launch/) and a
Kubernetes JobSet read to decide whether to start the job again.

  0    the run reached train.steps
  1    a crash (an exception that is not the user's to fix; a host lost mid-step): restart
  2    an error the user can fix (a bad config, a missing dataset, a NaN loss): a restart
       would fail the same way, so launchers stop
  75   stalled: no step finished within train.stall_timeout; every thread's stack is in the
       log; restart (EX_TEMPFAIL)
  143  preempted: SIGTERM reached a host; every host saved the same step; restart resumes
       (128 + SIGTERM, what a process killed by SIGTERM reports too)
"""

DONE = 0
CRASHED = 1
USER_ERROR = 2
STALLED = 75
PREEMPTED = 143

# What launch/restart.sh restarts (any other non-zero status too, except USER_ERROR).
RESTARTABLE = (CRASHED, STALLED, PREEMPTED)
