"""Configuration: every setting, built once from the command line with PATROLLER_* environment
fallbacks and the configuration file under them, into one immutable Config that is passed down
explicitly.

Owns: Config (settings and documented internal defaults), the command line that fills it, the
configuration file (`file`: TOML, its keys the long flags' names), `patroller config` (`shown`:
each setting and where it came from), what a reload may change (`live`), the fair-use policy
built from it (with the per-user limits file), the one bounded reader of the files an operator
names for it (`regular`: the configuration file, the limits file), and whether a directory it
names may be trusted (`trust`: its owner, its mode, the links on its path).
May import: `patroller.core`, `patroller.durations` and `patroller.hosts`; `tomli` on Python
3.10 (3.11's `tomllib` is the same parser).
"""

from patroller.config.flags import default_state_dir, load, settings_table
from patroller.config.policy import load_limits, policy_of
from patroller.config.settings import DEFAULT_USER_LABELS, Config, ConfigError

__all__ = [
    "DEFAULT_USER_LABELS",
    "Config",
    "ConfigError",
    "default_state_dir",
    "load",
    "load_limits",
    "policy_of",
    "settings_table",
]
