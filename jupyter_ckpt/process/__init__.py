"""The process state an image carries besides the namespace (DESIGN section 3): the
providers, in the order a restore applies them, and the user's ``sys.path``."""

from . import hashing, ipython, options, streams
from .hashing import hash_seed_env
from .paths import FreshKernel, apply_path, merged_path, to_check
from .registry import PREFIX, Provider, apply_states, capture_states, untouched

# Options before the streams: setting an option never draws a random number, while
# importing a library to set its options may (none known today; the order keeps it safe).
PROVIDERS: list[Provider] = [
    *options.PROVIDERS,
    *ipython.PROVIDERS,
    *streams.PROVIDERS,
    *hashing.PROVIDERS,
]

__all__ = [
    "PREFIX",
    "PROVIDERS",
    "FreshKernel",
    "Provider",
    "apply_path",
    "apply_states",
    "capture_states",
    "hash_seed_env",
    "merged_path",
    "to_check",
    "untouched",
]
