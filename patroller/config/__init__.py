"""Configuration: every setting, built once from the command line with PATROLLER_* environment
fallbacks, into one immutable Config that is passed down explicitly.

Owns: Config (settings and documented internal defaults) and the command line that fills it.
May import: `patroller.core` and `patroller.durations`.
"""
from patroller.config.flags import default_state_dir, load, settings_table
from patroller.config.settings import DEFAULT_USER_LABELS, Config, ConfigError

__all__ = ["DEFAULT_USER_LABELS", "Config", "ConfigError", "default_state_dir", "load",
           "settings_table"]
