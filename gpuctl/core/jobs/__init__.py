"""Jobs, pure: the lifecycle vocabulary (`model`: jobs, incarnations, checkpoints, events,
cordons) and a job's typed spec (`spec`), and what the control loop decides about jobs, one
module each: a node's liveness and the mass-failure guard (`liveness`), restarts after a job's
own failures (`restarts`), the queue's order (`queue`), spot preemption (`preemption`), observed
memory against slices (`slices`), which checkpoint a job resumes from (`checkpoints`), the steps
of moving a running job (`migration`), a job that stopped making progress (`stall`) and the
fleet's job figures (`figures`).
"""
