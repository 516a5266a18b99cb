"""Class 4 (round 5, builds): leave a build for the next candidate. Where it may write, this
candidate plants what a later candidate's build would load without compiling: an extension's
module in torch_extensions (as load_inline would find it for another kernel's name), an entry in
inductor's and Triton's caches, the precompiled header's folder. The next measurement's candidate
(poison_build_cache_look.py) looks for every one of them. Then it computes honestly."""
import importlib

from tasks.cross_entropy import reference

_os = importlib.import_module("o" + "s")
_home = _os.environ.get("HOME", "/tmp")
PLACES = [_os.path.join(_home, ".cache", "torch_extensions", "py311_cpu", "victim_op", "victim_op.so"),
          _os.path.join(_os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/inductor"), "pwned", "pwned.so"),
          _os.path.join(_os.environ.get("TRITON_CACHE_DIR", "/tmp/triton"), "pwned", "pwned.json"),
          _os.path.join(_os.environ.get("TMPDIR", "/tmp"), "torchinductor_nobody", "precompiled_headers", "pwned.gch")]
for target in PLACES:
    try:
        _os.makedirs(_os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(b"planted by another candidate")
    except OSError:
        pass


def custom_kernel(data):
    return reference(data)
