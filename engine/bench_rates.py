"""The machine's own rates, which set the floors of `goodput bench engine`.

Bandwidth: on a CPU a sum over 512 MB (a pure read); on a GPU a device-to-device copy of 1 GiB,
counted as bytes read plus bytes written, as GPU bandwidth is quoted. Compute: a square matmul in
the dtype the engine runs (2048^3 on a CPU, 8192^3 on a GPU), so a bfloat16 run gets a bfloat16
floor. Other processes share a CPU machine, so rates swing; the floors use the best rate seen in
the run (the machine can do at least that), which makes them strict.
"""

from __future__ import annotations

import statistics
import time


class MachineRates:
    def __init__(self, dtype: str = "float32", device: str = "cpu"):
        import torch

        self.device, self.dtype = device, dtype
        self.cuda = str(device).startswith("cuda")
        dt = getattr(torch, dtype)
        if self.cuda:
            self.src = torch.ones(2**28, device=device)  # 1 GiB of float32
            self.dst = torch.empty_like(self.src)
            self.n = 8192
        else:
            self.big = torch.ones(128 * 2**20)  # 512 MB of float32
            self.n = 2048
        self.a = torch.randn(self.n, self.n, device=device).to(dt)
        self.b = torch.randn(self.n, self.n, device=device).to(dt)
        self._read()
        self.a @ self.b
        self._sync()
        self.reads: list[float] = []
        self.matmuls: list[float] = []

    def _sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def _read(self) -> None:
        if self.cuda:
            self.dst.copy_(self.src)
        else:
            self.big.sum()

    def sample(self, repeats: int = 3) -> None:
        read_bytes = 2 * self.src.numel() * 4 if self.cuda else self.big.numel() * 4
        for _ in range(repeats):
            self._sync()
            t = time.perf_counter()
            self._read()
            self._sync()
            self.reads.append(read_bytes / (time.perf_counter() - t) / 1e9)
            t = time.perf_counter()
            self.a @ self.b
            self._sync()
            self.matmuls.append(2 * self.n**3 / (time.perf_counter() - t) / 1e9)

    def result(self) -> dict:
        return {"memory_read_gb_s": max(self.reads), "matmul_gflop_s": max(self.matmuls),
                "memory_read_gb_s_median": statistics.median(self.reads),
                "matmul_gflop_s_median": statistics.median(self.matmuls), "samples": len(self.reads),
                "matmul_dtype": self.dtype, "matmul_n": self.n,
                "bandwidth_method": "device copy, read + write" if self.cuda else "sum, read"}
