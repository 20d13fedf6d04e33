"""CPU emulation of the GPU angle paths of rope_math.h (issue 19), against exact truth.

    python bench/angle_emulation.py              # ~1 min on one core
    python bench/angle_emulation.py --n 64       # fewer positions per range (quicker)

For HF's float32 frequencies (base 10000 and 500000, R = 128) and positions in ranges
up to 2^24 and beyond (to 2^31), each path's
  arg    max |angle evaluated - exact angle| (rad): the argument the sin/cos routine is
         given (plus, for the corrected paths, the first-order correction term), against
         pos * f mod 2 pi computed exactly (f is an exact float32, so pos * f is an exact
         rational; 1 / 2 pi to 320 bits from mpmath, reduction in Python integers);
  out    max |s - sin|, |c - cos| over the outputs, with the library sin/cos modelled as
         correctly rounded fp32 results of their (exact) argument. CUDA documents
         sincosf at 2 ulp and sincospif at 1 ulp (the model's 0.5 ulp + 1.5 or 0.5 ulp of
         1.0 = 2^-24: up to +8.9e-8 or +3.0e-8 on top of `out`).
Emulated fp32 arithmetic is exact: numpy float32 ops are IEEE (correctly rounded); an fp32
fma(a, b, c) is a * b (exact in float64) + c as an exact float64 two-sum, rounded once to
float32 (ties resolved by the two-sum's tail); a float64 fma goes through fractions.

Paths (ROPE_EXT_ANGLE, setup.py):
  double     the default: a = pos * f in double (exact below 2^29), reduced mod 2 pi with a
             double-double 2 pi, rounded to fp32 radians, sincosf.
  sincospif  issue 11's opt-in: a / pi in double, reduced mod 2 half-turns, fp32, sincospif.
  turns      the issue's suggestion: f in turns as an fp32 pair hi + lo (split in the kernel
             from f, fp32 only), p = pos hi, e = fma(pos, hi, -p) (exact), r = (p - rint(p)) +
             fma(pos, lo, e) with the rounding of that sum kept (Fast2Sum, d) and added
             after sincospif(2 r) as a first-order correction; |pos| >= 2^24 (fp32 pos
             inexact) falls back to the double reduction.
  turns-nc   the same without the correction (sincospif(2 r) only).
  fixed      f in turns as a 64-bit fixed-point fraction T = f * 2^64 / 2 pi (integer
             multiply of f's 24-bit significand by a 64-bit 1 / 2 pi), the turn count
             pos * T mod 2^64 (exact integer multiply, any int64 pos), its top 24 bits
             to sincospif and the rest as the correction; no FP64, no branch.
"""
import argparse
import math
from fractions import Fraction

import mpmath
import numpy as np
import torch

F32, F64 = np.float32, np.float64
mpmath.mp.prec = 400
FIX = 320
INV2PI_FIX = int(mpmath.floor(mpmath.mpf(2) ** FIX / (2 * mpmath.pi)))  # 1 / 2 pi, 320 fractional bits
TWO_PI_HI, TWO_PI_LO = 6.283185307179586, 2.4492935982947064e-16  # rope_math.h's double-double 2 pi
INV2PI_D = 0.15915494309189535
INV_PI_D = 0.3183098861837907
C_HI = F32(float(1 / (2 * mpmath.pi)))  # fp32 1 / 2 pi and its remainder (turns path)
C_LO = F32(float(1 / (2 * mpmath.pi) - mpmath.mpf(float(C_HI))))
TWO_PI_F = F32(2 * math.pi)
K64 = int(mpmath.nint(mpmath.mpf(2) ** 64 / (2 * mpmath.pi)))  # fixed path: 2^64 / 2 pi, 62 bits


def hf_inv_freq(R, base):
    return (1.0 / (base ** (torch.arange(0, R, 2, dtype=torch.int64).to(dtype=torch.float) / R))).numpy()


def true_turns(pos, f):
    """frac(pos * f / 2 pi) in [-0.5, 0.5), exactly rounded to float64."""
    out = np.empty(len(pos))
    for j, (p, ff) in enumerate(zip(pos.tolist(), f.tolist())):
        n, d = float(ff).as_integer_ratio()  # d: a power of two
        M = d << FIX
        x = (p * n * INV2PI_FIX) % M
        if 2 * x >= M:
            x -= M
        out[j] = x / M
    return out


def fma32(a, b, c):
    """fp32 fma, exact: a * b is exact in float64; the sum is a two-sum, rounded once."""
    prod = a.astype(F64) * b.astype(F64)
    c = c.astype(F64)
    s = prod + c
    bb = s - prod
    err = (prod - (s - bb)) + (c - bb)  # s + err == prod + c exactly
    r = s.astype(F32)
    d = s - r.astype(F64)  # exact
    toward = np.nextafter(r, np.where(d >= 0, F32(np.inf), F32(-np.inf)).astype(F32))
    half = (toward.astype(F64) - r.astype(F64)) / 2
    tie = (d != 0) & (d == half) & (err != 0)
    # s lies exactly halfway: the tail decides (away from r when it points away)
    r = np.where(tie & (np.sign(err) == np.sign(d)), toward, r)
    return r.astype(F32)


def fma64(a, b, c):
    return np.array([float(Fraction(x) * Fraction(y) + Fraction(z)) for x, y, z in zip(a, b, c)])


def wrap_turns(x):
    return x - np.rint(x)


def double_reduce(pos, f):
    """rope_math.h's default reduction: radians, double, |r| <= pi."""
    a = pos.astype(F64) * f.astype(F64)
    k = np.rint(a * INV2PI_D)
    r = fma64(-k, np.full_like(k, TWO_PI_HI), a)
    return fma64(-k, np.full_like(k, TWO_PI_LO), r)


def path_double(pos, f, red):
    rf = red.astype(F32)
    x = rf.astype(F64)
    return x / (2 * math.pi), np.sin(x).astype(F32), np.cos(x).astype(F32)


def path_sincospif(pos, f, red):
    a = pos.astype(F64) * f.astype(F64)
    t = a * INV_PI_D
    r = (t - 2 * np.rint(t * 0.5)).astype(F32).astype(F64)  # half-turns
    return r / 2, np.sin(np.pi * r).astype(F32), np.cos(np.pi * r).astype(F32)


def sincospi32(x):
    x = x.astype(F64)
    return np.sin(np.pi * x).astype(F32), np.cos(np.pi * x).astype(F32)


def correct(s0, c0, d):
    """s = fma(a, c0, s0), c = fma(-a, s0, c0) with a = 2 pi d (fp32)."""
    a = (TWO_PI_F * d).astype(F32)
    return fma32(a, c0, s0), fma32(-a, s0, c0)


def path_turns(pos, f, red, corrected=True):
    f = f.astype(F32)
    h0 = (f * C_HI).astype(F32)
    e0 = (f.astype(F64) * F64(C_HI) - h0.astype(F64)).astype(F32)  # exact
    l0 = fma32(f, np.full_like(f, C_LO), e0)
    hi = (h0 + l0).astype(F32)
    lo = (l0 - (hi - h0)).astype(F32)
    posf = pos.astype(F32)  # the kernel converts (int32) pos, used only where exact
    p = (posf * hi).astype(F32)
    e = (posf.astype(F64) * hi.astype(F64) - p.astype(F64)).astype(F32)  # exact
    f1 = (p - np.rint(p)).astype(F32)
    q = fma32(posf, lo, e)
    r = (f1 + q).astype(F32)
    d = (q - (r - f1)).astype(F32)
    small = (np.abs(pos) < 2**24) & (np.abs(p) < 2**22)
    # fallback: the double reduction, in turns, rounded to fp32 + remainder
    t = red * INV2PI_D  # the kernel's fma(-k, 2 pi lo, r) * (1 / 2 pi)
    rb = t.astype(F32)
    db = (t - rb.astype(F64)).astype(F32)
    r, d = np.where(small, r, rb), np.where(small, d, db)
    s0, c0 = sincospi32((2 * r).astype(F32))
    if not corrected:
        return r.astype(F64), s0, c0
    s, c = correct(s0, c0, d)
    return r.astype(F64) + d.astype(F64), s, c


def turns_fixed(f):
    """rope_math.h's turns_fixed, bit for bit: f / 2 pi as a 64-bit fraction of a turn."""
    out = []
    for bits in f.astype(F32).view(np.uint32).tolist():
        ex = (bits >> 23) & 0xFF
        m = ((bits & 0x7FFFFF) | 0x800000) if ex else bits & 0x7FFFFF
        sh = 150 - (ex if ex else 1)
        prod = m * K64  # 86 bits
        t = (prod >> sh) if sh > 0 else (prod << min(-sh, 63))
        t &= 2**64 - 1
        out.append((2**64 - t) % 2**64 if bits >> 31 else t)
    return out


def path_fixed(pos, f, red):
    r, rl = [], []
    for p, t in zip(pos.tolist(), turns_fixed(f)):
        x = (p * t) & (2**64 - 1)  # uint64 product
        if x >= 2**63:
            x -= 2**64  # as int64
        r.append(x >> 40)  # top 24 bits (arithmetic shift: floor)
        rl.append((x >> 8) & 0xFFFFFFFF)  # the next 32
    h = (np.array(r, dtype=F64).astype(F32) * F32(2.0**-23)).astype(F32)  # half-turns, exact
    d = (np.array(rl, dtype=F64).astype(F32) * F32(2.0**-56)).astype(F32)
    s0, c0 = sincospi32(h)
    s, c = correct(s0, c0, d)
    return h.astype(F64) / 2 + d.astype(F64), s, c


PATHS = [("double", path_double), ("sincospif", path_sincospif), ("turns", path_turns),
         ("turns-nc", lambda p, f, r: path_turns(p, f, r, corrected=False)), ("fixed", path_fixed)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=160, help="random positions per range (+ the range's last)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    ranges = [(0, 2**12), (2**12, 2**16), (2**16, 2**20), (2**20, 2**24), (2**24, 2**29), (2**29, 2**31 + 1)]
    R = 128
    print(f"max error (rad for arg, absolute for out) over HF fp32 frequencies, R={R}, bases 10000 and 500000, "
          f"{a.n + 1} positions per range")
    print(f"{'positions':<16}" + "".join(f"{n + ' arg':>13}{n + ' out':>13}" for n, _ in PATHS))
    for lo, hi in ranges:
        pos = np.unique(np.concatenate([rng.integers(lo, hi, a.n), [hi - 1]])).astype(np.int64)
        worst = {n: [0.0, 0.0] for n, _ in PATHS}
        for base in (10000.0, 500000.0):
            fr = hf_inv_freq(R, base)
            P, Fq = np.repeat(pos, len(fr)), np.tile(fr, len(pos)).astype(F32)
            truth = true_turns(P, Fq)
            ts, tc = np.sin(2 * np.pi * truth), np.cos(2 * np.pi * truth)
            red = double_reduce(P, Fq)
            for name, fn in PATHS:
                arg, s, c = fn(P, Fq, red)
                ea = np.abs(wrap_turns(arg - truth)).max() * 2 * math.pi
                eo = max(np.abs(s.astype(F64) - ts).max(), np.abs(c.astype(F64) - tc).max())
                worst[name][0] = max(worst[name][0], ea)
                worst[name][1] = max(worst[name][1], eo)
        label = f"[2^{int(math.log2(lo)) if lo else 0}, 2^{round(math.log2(hi))})"
        print(f"{label:<16}" + "".join(f"{worst[n][0]:>13.2e}{worst[n][1]:>13.2e}" for n, _ in PATHS), flush=True)


if __name__ == "__main__":
    main()
