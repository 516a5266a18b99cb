"""Output checks shared by every task: exact types first, then values, as GPU MODE compares them.

The type checks close the lazy-output hole (docs/MEASUREMENT.md): a candidate must return plain,
dense torch.Tensor objects of the reference's shape, on its device. The values follow GPU MODE's
checker (`verbose_allclose` in its reference-kernels repository): both sides are cast to fp32
before the tolerance check, so an output of another floating dtype (fp16 where the reference is
fp32) passes when its values are close enough (unless the problem's own checker asserts the dtype:
`exact_dtype`, as cross_entropy's does); |out - ref| <= atol + rtol * |ref| elementwise;
and NaN, +inf and -inf must each appear exactly where the reference has them (kind for kind), so
a NaN-poisoned, unwritten output element always fails.
"""
import torch


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def compare_outputs(output, expected, rtol, atol, names=None, exact_dtype=False):
    """Return (ok, message) comparing a candidate's output to the reference's. exact_dtype: the
    output must also have the reference's dtype (a problem whose original checker asserts it)."""
    out, exp = _as_tuple(output), _as_tuple(expected)
    if len(out) != len(exp):
        return False, f"expected {len(exp)} output tensor(s), got {len(out)}"
    names = names or [f"output[{i}]" for i in range(len(exp))]
    for name, o, e in zip(names, out, exp):
        if type(o) is not torch.Tensor:  # subclasses can defer work into the checker
            return False, f"{name}: expected a plain torch.Tensor, got {type(o).__name__}"
        if exact_dtype and o.dtype != e.dtype:
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
    return True, "ok"
