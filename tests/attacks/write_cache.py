"""Class 4: plant a forged result in the measurement cache (every place it could be), and into
the project's own files, then compute honestly."""
import glob
import importlib
import json

from tasks.cross_entropy import reference

_os = importlib.import_module("o" + "s")
forged = json.dumps({"task": "cross_entropy", "status": "ok", "speedup": 1000.0, "harness_version": "2.0"})
places = [_os.path.expanduser("~/.cache/gpu-forecasters/measurements"), "/root/.cache/gpu-forecasters/measurements",
          *glob.glob("/tmp/*/measurements"), *glob.glob("/tmp/gpu-forecasters*"), *glob.glob("/tmp/pytest-of-*/*/*"),
          _os.path.dirname(_os.path.dirname(_os.path.abspath(reference.__code__.co_filename)))]
for place in places:
    try:
        _os.makedirs(place, exist_ok=True)
        with open(_os.path.join(place, "pwned-cache-entry.json"), "w") as f:
            f.write(forged)
    except OSError:
        pass


def custom_kernel(data):
    return reference(data)
