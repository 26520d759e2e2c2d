"""Stage by stage, the calls of test_cuda.py's first test in one process, each stage named
(flushed) before it runs: when the process dies, the last name in the log says which stage
killed it. Run by scripts/gpu_check.sh's python_cuda step before pytest, with the package
built with SPECULA_PYTHON_CUDA=ON on PYTHONPATH; exits 77 without a CUDA build or a GPU."""

import gc
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python",
                                "tests"))
from helpers import random_batch  # noqa: E402


def stage(name):
    print("stage:", name, flush=True)


stage("import specula_sd")
import specula_sd as specula  # noqa: E402

stage("relaxed_rule(2.0) before torch")
specula.relaxed_rule(2.0)
p, q, drafts, _, seeds, steps = random_batch(11, batch=24, vocab=300)
for rule in (None, specula.relaxed_rule(2.0)):
    stage(f"CPU call, rule {rule!r}")
    specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps, rule=rule)

stage("import torch")
import torch  # noqa: E402

if not (specula._HAS_CUDA and torch.cuda.is_available()):
    print("no CUDA build or no GPU: skipped", flush=True)
    sys.exit(77)
stage("relaxed_rule(2.0) after torch.cuda.is_available()")
specula.relaxed_rule(2.0)
stage("torch CUDA tensors")
dq, dd, dp = (torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in (q, drafts, p))
torch.cuda.synchronize()
stage("relaxed_rule(2.0) after torch's CUDA initialisation")
specula.relaxed_rule(2.0)
for rule in (None, specula.relaxed_rule(2.0)):
    ref, ref_n, _ = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps,
                                                       rule=rule)
    stage(f"CUDA call, rule {rule!r}")
    out, n, _ = specula.chain_speculative_sampling(dq, dd, dp, seeds=seeds, steps=steps,
                                                   rule=rule)
    stage("synchronise")
    torch.cuda.synchronize()
    stage("compare with the CPU")
    print("  tokens equal:", out.cpu().tolist() == ref.tolist(), "| counts equal:",
          n.cpu().tolist() == ref_n.tolist(), flush=True)
    stage("relaxed_rule(2.0) after the CUDA call")
    specula.relaxed_rule(2.0)
    stage("gc.collect()")
    gc.collect()
stage("done")
