"""The second half of poison_build_cache.py: a candidate that fails loudly if any build its
predecessor planted is where its own build would look."""
import importlib

from tasks.cross_entropy import reference

_os = importlib.import_module("o" + "s")
_home = _os.environ.get("HOME", "/tmp")
PLACES = [_os.path.join(_home, ".cache", "torch_extensions", "py311_cpu", "victim_op", "victim_op.so"),
          _os.path.join(_os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/inductor"), "pwned", "pwned.so"),
          _os.path.join(_os.environ.get("TRITON_CACHE_DIR", "/tmp/triton"), "pwned", "pwned.json"),
          _os.path.join(_os.environ.get("TMPDIR", "/tmp"), "torchinductor_nobody", "precompiled_headers", "pwned.gch")]
FOUND = [p for p in PLACES if _os.path.exists(p)]
if FOUND:
    raise RuntimeError(f"a build planted by another candidate is here: {FOUND}")


def custom_kernel(data):
    return reference(data)
