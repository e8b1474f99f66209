"""The search: one study, many trials, one or more GPU workers.

* ``loop``: the Optuna ask/tell loop of one worker (``fa-tune search``);
* ``sampler``, ``space``, ``policy``: what is proposed, from which knobs, measured how;
* ``study`` / ``rdb``: study storage (SQLite/PostgreSQL), reading it, the connection's retry and
  the trials' heartbeat; ``trials``: picking a study's best trial;
* ``worker_client`` / ``gpu_worker``: the GPU worker subprocess and its parent's side;
* ``fleet``: one worker per GPU of this host, and joining a study from another host.
"""
