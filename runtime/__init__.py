"""runtime: where a run runs. A first read may skip this folder.

The algorithms (search.py's loop, train_grpo.py's step) do not change with the machine; this
folder holds what does:

  measure_pool.py     several measurements at once, one per device (threads, or a Ray cluster).
  grpo_sampling.py    where GRPO's samples come from (this process, or a vLLM server).
  grpo_ddp.py         GRPO across processes with accelerate (filler batches, gathering).
  grpo_checkpoint.py  resuming a GRPO run as if it had not stopped.
  cli.py              a command's settings as one dataclass, which is its command line.
"""
