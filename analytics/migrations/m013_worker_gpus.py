"""Version 13: the GPUs of each heartbeat's worker, which ``report cost`` bills.

A worker serving a model with tensor parallelism (``governor worker --tp 4``) runs on several
GPUs; its heartbeat says how many (``WorkerStatus.gpus``, written only above 1). Before this
version ``worker_status`` kept no count and ``report cost`` billed every worker as one GPU.
Rows written before keep 1 (the column's default), as does a heartbeat without the field.
"""

STATEMENTS = [
    """
ALTER TABLE worker_status
    ADD COLUMN IF NOT EXISTS gpus UInt16 DEFAULT 1 AFTER gpu_type""",
]
