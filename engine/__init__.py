"""The bundled inference engine: Llama in torch, paged KV cache, continuous batching."""

import os

# OpenMP threads that spin while waiting are a disaster on a shared 2-core machine: measured with
# other processes busy, a 576x1536 matvec took 11 ms with spinning threads and 0.37 ms with
# passive ones. This must be set before torch loads its OpenMP runtime, i.e. before `import torch`;
# an explicit OMP_WAIT_POLICY from the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
