"""Output checks shared by every task: exact types first, then values.

The type checks close the lazy-output and silent-downgrade holes (docs/MEASUREMENT.md):
a candidate must return plain, dense torch.Tensor objects with the reference's dtype, shape and
device. Values are compared with torch.isclose semantics, and NaN/inf must appear exactly where
the reference has them, so a NaN-poisoned, unwritten output element always fails.
"""
import torch


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def compare_outputs(output, expected, rtol, atol, names=None):
    """Return (ok, message) comparing a candidate's output to the reference's."""
    out, exp = _as_tuple(output), _as_tuple(expected)
    if len(out) != len(exp):
        return False, f"expected {len(exp)} output tensor(s), got {len(out)}"
    names = names or [f"output[{i}]" for i in range(len(exp))]
    for name, o, e in zip(names, out, exp):
        if type(o) is not torch.Tensor:  # subclasses can defer work into the checker
            return False, f"{name}: expected a plain torch.Tensor, got {type(o).__name__}"
        if o.dtype != e.dtype:
            return False, f"{name}: dtype {o.dtype}, expected {e.dtype}"
        if tuple(o.shape) != tuple(e.shape):
            return False, f"{name}: shape {tuple(o.shape)}, expected {tuple(e.shape)}"
        if o.device != e.device:
            return False, f"{name}: device {o.device}, expected {e.device}"
        if o.layout != torch.strided or o.is_sparse:
            return False, f"{name}: expected a dense strided tensor"
        of, ef = o.detach().float(), e.detach().float()
        finite = torch.isfinite(ef)
        if not torch.equal(torch.isfinite(of), finite):
            bad = int((torch.isfinite(of) != finite).sum())
            return False, f"{name}: {bad} element(s) non-finite where the reference is finite (or vice versa)"
        close = torch.isclose(of[finite], ef[finite], rtol=rtol, atol=atol)
        if not bool(close.all()):
            n_bad = int((~close).sum())
            diff = (of[finite] - ef[finite]).abs()
            return False, (f"{name}: {n_bad} of {close.numel()} elements outside rtol={rtol}, "
                           f"atol={atol} (max abs diff {float(diff.max()):.3g})")
    return True, "ok"
