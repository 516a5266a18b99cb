"""Output checks shared by every task: exact types first, then values, as GPU MODE compares them,
then one check GPU MODE does not make.

The type checks close the lazy-output and the silent-downgrade holes (docs/MEASUREMENT.md): a
candidate must return plain, dense torch.Tensor objects of the reference's shape, on its device,
of the reference's dtype, unless the task names another dtype its original's checker accepts
(`allowed_dtypes`: trimul's fp16, which GPU MODE's checker casts and its leaderboard accepted).
The values follow GPU MODE's checker (`verbose_allclose` in its reference-kernels repository):
both sides are cast to fp32 before the tolerance check, |out - ref| <= atol + rtol * |ref|
elementwise, and NaN, +inf and -inf must each appear exactly where the reference has them (kind
for kind), so a NaN-poisoned, unwritten output element always fails.

Then the error as a whole: sum |out - ref| <= rtol * sum |ref| over the finite elements (the
1-norm: the mean absolute error against the mean absolute value). An output within rtol element
by element is within it in this norm too; only elements that the absolute slack alone let
through can break it, and only when together they carry a share of the output's magnitude:
atol is there for values near zero, where a relative error means nothing, not to let a kernel
skip most of an output. A cross_entropy gradient whose elements below atol are all written as 0
passes the elementwise test (each is within atol of 0) and is wrong in nearly all its elements;
in this norm it is half wrong at every vocabulary size (the zeroed elements of a row sum to what
its one large element holds). The 1-norm, not the 2-norm: in the 2-norm the many small elements
weigh next to nothing beside the large one (under 1% at V = 32,000).
"""
import torch


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def compare_outputs(output, expected, rtol, atol, names=None, allowed_dtypes=()):
    """Return (ok, message) comparing a candidate's output to the reference's. allowed_dtypes:
    dtypes besides the reference's that an output may have (names, e.g. "float16"), where the
    task's original checker accepts them."""
    out, exp = _as_tuple(output), _as_tuple(expected)
    if len(out) != len(exp):
        return False, f"expected {len(exp)} output tensor(s), got {len(out)}"
    names = names or [f"output[{i}]" for i in range(len(exp))]
    for name, o, e in zip(names, out, exp):
        if type(o) is not torch.Tensor:  # subclasses can defer work into the checker
            return False, f"{name}: expected a plain torch.Tensor, got {type(o).__name__}"
        if o.dtype != e.dtype and str(o.dtype).removeprefix("torch.") not in allowed_dtypes:
            return False, f"{name}: dtype {o.dtype}, expected {e.dtype}"
        if tuple(o.shape) != tuple(e.shape):
            return False, f"{name}: shape {tuple(o.shape)}, expected {tuple(e.shape)}"
        if o.device != e.device:
            return False, f"{name}: device {o.device}, expected {e.device}"
        if o.layout != torch.strided or o.is_sparse:
            return False, f"{name}: expected a dense strided tensor"
        of, ef = o.detach().to(torch.float32), e.detach().to(torch.float32)
        for kind, test in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
            wrong = test(of) != test(ef)
            if bool(wrong.any()):
                return False, f"{name}: {int(wrong.sum())} element(s) {kind} where the reference is not (or vice versa)"
        finite = torch.isfinite(ef)
        diff = (of[finite] - ef[finite]).abs()
        bad = diff > atol + rtol * ef[finite].abs()
        if bool(bad.any()):
            return False, (f"{name}: {int(bad.sum())} of {bad.numel()} elements outside rtol={rtol}, "
                           f"atol={atol} (max abs diff {float(diff.max()):.3g})")
        error = float(diff.double().sum())
        scale = float(ef[finite].double().abs().sum())
        if error > rtol * scale:
            return False, (f"{name}: every element is within rtol={rtol}, atol={atol}, but the mean absolute "
                           f"error is {error / scale:.2%} of the mean absolute value (at most rtol): the absolute "
                           "tolerance lets through elements that carry that share of the output")
    return True, "ok"
