"""Context parallelism over real torch.distributed process groups (2 processes).

Every rank builds the same full inputs (one seed, drawn fresh in the parent), takes its
load-balanced shard (bshd, sbhd, thd with several packed sequences, one of them empty),
rotates it with apply_rope_qk(..., cp_group=) and (..., cp_size=, cp_rank=), runs the
backward, all-gathers the local outputs and input grads, reassembles them with
context_parallel_unshard and compares them with the unsharded single-process call:
bitwise (same kernel, same positions), fp32 and bf16, every variant name.

Spawning and `import torch` dominate the runtime, so each backend is ONE spawn of 2
processes that runs every check; each rank writes its findings to a JSON file that the
parent reads (a crash in a child surfaces as torch.multiprocessing's exception, with
the child's traceback). gloo runs on CPU; nccl (one GPU per rank) needs >= 2 GPUs.
"""
import datetime
import inspect
import json
import os
import random
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import rope_ext

WORLD = 2
D = 64
# Global (padded) lengths, multiples of 2 * WORLD, one sequence empty: cu_seqlens as
# TransformerEngine takes them under CP.
CU = [0, 12, 12, 40, 44, 52]
THD_OFFSETS = [5, 0, 100, 7, 1]  # per-sequence offsets, added to the global positions
# NVLink multicast stays off in every spawned process (it can take a shared host's GPUs down).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TIMEOUT_S = 180  # a hung collective fails the test instead of blocking it


def _module_has_cp():
    return "cp_group" in inspect.signature(rope_ext.RotaryEmbedding.forward).parameters


# ------------------------------------------------------------------------------ the child
def _cases(device):
    """(name, layout, seq_dim, kwargs shared by the full and the local call)."""
    cu = torch.tensor(CU, dtype=torch.int32, device=device)
    return [
        ("bshd", "bshd", 1, {}),
        ("sbhd", "sbhd", 0, {}),
        ("thd", "thd", 0, dict(cu_seqlens=cu)),
        ("thd+offsets", "thd", 0, dict(cu_seqlens=cu, offsets=torch.tensor(THD_OFFSETS, device=device))),
        ("bshd partial interleaved", "bshd", 1, dict(rotary_dim=32, interleaved=True, base=500000.0, offsets=3)),
    ]


def _full_inputs(layout, dtype, device, gen):
    """q [.., Hq=4, D], k [.., Hk=2, D] (GQA) and output grads, the same bits on every rank."""
    def rnd(*shape):
        return (torch.randn(shape, generator=gen) * 2).to(dtype).to(device)
    seq = {"bshd": (2, 24), "sbhd": (24, 2), "thd": (CU[-1],)}[layout]
    return rnd(*seq, 4, D), rnd(*seq, 2, D), rnd(*seq, 4, D), rnd(*seq, 2, D)


def _gather(t, group):
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return parts


def _diff(a, b):
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    d = (a.double() - b.double()).abs()
    return f"max |diff| {d.nan_to_num(float('inf')).max().item():.3e}, {int((~(a == b)).sum())} elements differ"


def _check(found, what, got, want):
    found["checks"] += 1
    if not torch.equal(got, want):
        found["failures"].append(f"{what}: not bitwise equal to the unsharded call ({_diff(got, want)})")


def _rope_fn(impl):
    return lambda q, k, **kw: rope_ext.apply_rope_qk(q, k, impl=impl, **kw)


def _module_fn(module):
    return lambda q, k, **kw: module(q, k, **kw)


def _compare(found, name, fn, kw, layout, seq_dim, dtype, device, gen, group, rank, world, modes):
    """One input set: unsharded reference vs the gathered shards, forward and grads, per CP mode."""
    q, k, gq, gk = _full_inputs(layout, dtype, device, gen)
    cu = kw.get("cu_seqlens")
    qf, kf = q.clone().requires_grad_(), k.clone().requires_grad_()
    want_q, want_k = fn(qf, kf, layout=layout, **kw)
    torch.autograd.backward([want_q, want_k], [gq, gk])

    def shard(t):
        return rope_ext.context_parallel_shard(t, world, rank, seq_dim=seq_dim, cu_seqlens=cu)

    def unshard(t):
        return rope_ext.context_parallel_unshard(_gather(t, group), seq_dim=seq_dim, cu_seqlens=cu)

    for mode in modes:
        cp = dict(cp_group=group) if mode == "cp_group" else dict(cp_size=world, cp_rank=rank)
        ql, kl = shard(q).requires_grad_(), shard(k).requires_grad_()
        out_q, out_k = fn(ql, kl, layout=layout, **cp, **kw)
        torch.autograd.backward([out_q, out_k], [shard(gq), shard(gk)])
        what = f"{name} {str(dtype)[6:]} {mode}"
        for label, local, want in (("q", out_q, want_q), ("k", out_k, want_k),
                                   ("dq", ql.grad, qf.grad), ("dk", kl.grad, kf.grad)):
            _check(found, f"{what} {label}", unshard(local.detach()), want.detach())
    # Control: the same shard rotated by its LOCAL positions (no CP; thd: the local
    # cu_seqlens) must differ, so the comparison above tells global positions from local ones.
    local_kw = dict(kw, cu_seqlens=cu // world) if cu is not None else kw
    out_q, _ = fn(shard(q), shard(k), layout=layout, **local_kw)
    found["checks"] += 1
    if torch.equal(unshard(out_q), want_q.detach()):
        found["failures"].append(f"{name} {str(dtype)[6:]}: control failed: local positions gave the global result")


def _run_checks(rank, world, device, seed, group):
    found = {"checks": 0, "failures": []}
    for dtype in (torch.float32, torch.bfloat16):
        for ci, (name, layout, seq_dim, kw) in enumerate(_cases(device)):
            for impl in ("auto",) + rope_ext.IMPLS:
                # The same generator seed on every rank: identical full inputs.
                gen = torch.Generator().manual_seed(seed + 1000 * ci + 7 * (dtype == torch.bfloat16))
                modes = ("cp_group", "cp_size") if impl == "auto" else ("cp_group",)
                _compare(found, f"{name} impl={impl}", _rope_fn(impl), kw, layout, seq_dim, dtype, device, gen,
                         group, rank, world, modes)
    # RotaryEmbedding (q, k in one launch) with CP, once its forward takes cp_group.
    module_found = {"checks": 0, "failures": []} if _module_has_cp() else None
    if module_found is not None:
        for mname, module in (("RotaryEmbedding", rope_ext.RotaryEmbedding(D)),
                              ("RotaryEmbedding cache", rope_ext.RotaryEmbedding(D, max_position=256)),
                              ("RotaryEmbedding yarn", rope_ext.RotaryEmbedding(
                                  D, scaling=dict(rope_type="yarn", factor=4.0,
                                                  original_max_position_embeddings=32)))):
            module = module.to(device)
            for ci, (name, layout, seq_dim, kw) in enumerate(_cases(device)[:4]):
                gen = torch.Generator().manual_seed(seed + 77 + ci)
                _compare(module_found, f"{mname} {name}", _module_fn(module), kw, layout, seq_dim, torch.bfloat16,
                         device, gen, group, rank, world, ("cp_group", "cp_size"))
    return {"rope": found, "module": module_found}


def _worker(rank, world, backend, init_file, out_dir, seed):
    os.environ.update(NCCL_ENV)  # before any NCCL communicator exists
    torch.set_num_threads(1)  # 2 processes on few cores: no oversubscription
    result = {"rank": rank, "backend": backend, "seed": seed}
    t0 = time.perf_counter()
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = f"cuda:{rank}"
        else:
            device = "cpu"
        rope_ext._C.set_poison(True)  # unwritten output elements become NaN and fail
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S // 2))
        result.update(_run_checks(rank, world, device, seed, dist.group.WORLD))
    except Exception:
        result["error"] = traceback.format_exc()
        result["error_time"] = time.time()  # the earliest error is the cause; the peers' follow from it
    result["seconds"] = time.perf_counter() - t0
    # Written before the group is torn down: a peer that fails because of it cannot win the race.
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if dist.is_initialized():
        dist.destroy_process_group()
    if "error" in result:
        raise SystemExit(f"rope_ext: rank {rank} failed (its traceback is in rank{rank}.json)")


# ------------------------------------------------------------------------------ the parent
def _read_results(tmp):
    return [json.loads(p.read_text()) for p in sorted(tmp.glob("rank*.json"))]


def _spawn(backend, tmp):
    seed = random.SystemRandom().randrange(1 << 30)
    with pytest.MonkeyPatch.context() as mpatch:
        for key, val in NCCL_ENV.items():
            mpatch.setenv(key, val)  # the children inherit the parent's environment
        ctx = mp.start_processes(_worker, args=(WORLD, backend, str(tmp / "store"), str(tmp), seed), nprocs=WORLD,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"rope_ext: {backend} ranks still running after {TIMEOUT_S} s (seed {seed})")
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
        # Report every rank's own traceback, earliest first, not just the one join saw.
        errors = sorted((r for r in _read_results(tmp) if "error" in r), key=lambda r: r["error_time"])
        detail = "\n".join(f"--- rank {r['rank']}:\n{r['error']}" for r in errors) or "(no rank wrote a result)"
        pytest.fail(f"rope_ext: {backend} ranks failed (seed {seed}): {e}\n{detail}", pytrace=False)
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
    results = _read_results(tmp)
    assert [r["rank"] for r in results] == list(range(WORLD)), f"rope_ext: missing rank results ({backend})"
    return results


@pytest.fixture(scope="module", params=[
    "gloo",
    pytest.param("nccl", marks=pytest.mark.skipif(
        not dist.is_nccl_available() or torch.cuda.device_count() < 2 or not rope_ext.WITH_CUDA,
        reason="nccl needs 2 GPUs (one per rank) and a CUDA build")),
])
def dist_results(request, tmp_path_factory):
    return _spawn(request.param, tmp_path_factory.mktemp(f"cp_{request.param}"))


def _assert_all_equal(results, key, min_checks):
    msgs = []
    for r in results:
        found = r[key]
        assert found["checks"] >= min_checks, f"rope_ext: rank {r['rank']} ran only {found['checks']} {key} checks"
        msgs += [f"rank {r['rank']}: {m}" for m in found["failures"]]
    assert not msgs, (f"rope_ext: {len(msgs)} mismatches ({results[0]['backend']}, seed {results[0]['seed']}):\n"
                      + "\n".join(msgs[:30]))


def test_apply_rope_context_parallel_distributed(dist_results):
    """Gathered shards == the unsharded call, bit for bit: outputs and input grads."""
    _assert_all_equal(dist_results, "rope", 200)


@pytest.mark.skipif(not _module_has_cp(),
                    reason="RotaryEmbedding.forward takes no cp_group yet (CP goes through apply_rope_qk until then)")
def test_rotary_embedding_context_parallel_distributed(dist_results):
    """RotaryEmbedding(q, k, cp_group= / cp_size=, cp_rank=): default, cached and yarn frequencies."""
    assert all(r["module"] is not None for r in dist_results), "rope_ext: the ranks ran no RotaryEmbedding checks"
    _assert_all_equal(dist_results, "module", 50)
