"""One `<gpu>` element of `nvidia-smi -q -x` read for its health (core/health.py's Reading).

Each driver era names these sections its own way (docs/gpu-host.md has the table):
- `<remapped_rows>`: `remapped_row_pending`/`remapped_row_failure` Yes or No and the counts
  `remapped_row_unc` (R460 on, Ampere on); the text `N/A` where the GPU has no row remapper.
- `<retired_pages>`: `pending_retirement` (and `pending_blacklist` in R450 to R5xx) Yes or No,
  `retired_count` under `multiple_single_bit_retirement` and `double_bit_retirement`; `N/A`
  where the GPU retires no pages (it remaps rows instead).
- `<ecc_errors><volatile>`: `<double_bit><total>` before R450 (and on Pascal later);
  `sram_uncorrectable` and `dram_uncorrectable` after; `sram_uncorrectable_parity` and
  `sram_uncorrectable_secded` in R570 on. Every one of them is summed.
- `<clocks_throttle_reasons>` with `clocks_throttle_reason_*` before R535, then
  `<clocks_event_reasons>` with `clocks_event_reason_*`: `Active` or `Not Active`.
- `<gpu_reset_status><reset_required>` (R535 on) and `<gpu_recovery_action>` (R570 on):
  `None`, or what the driver asks for (`GPU Reset`, `Node Reboot`, `Drain P2P`, ...).
- Any field reading `GPU is lost` or `GPU requires reset` where a value should be.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from patroller.core.health import SLOWDOWNS, Reading

_BROKEN = ("gpu is lost", "gpu requires reset")
_NOT_ASKED = ("", "none", "n/a", "not supported", "requested functionality has been deprecated")


def _flag(gpu: ET.Element, path: str) -> bool | None:
    """Yes as True, No as False; anything else (N/A, absent) as None."""
    text = (gpu.findtext(path) or "").strip().lower()
    return True if text == "yes" else False if text == "no" else None


def _count(gpu: ET.Element, path: str) -> int | None:
    text = (gpu.findtext(path) or "").strip()
    return int(text) if text.isdigit() else None


def _sum(*counts: int | None) -> int | None:
    """The sum of the counts printed as numbers; None when none was."""
    known = [c for c in counts if c is not None]
    return sum(known) if known else None


def _ecc(gpu: ET.Element) -> int | None:
    """The volatile uncorrectable ECC count, summed over what the era prints."""
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None
    counts = [_count(volatile, "double_bit/total")]
    counts += [_count(volatile, child.tag) for child in volatile if "uncorrectable" in child.tag]
    return _sum(*counts)


def _slowdowns(gpu: ET.Element) -> tuple[str, ...]:
    for section in ("clocks_event_reasons", "clocks_throttle_reasons"):
        node = gpu.find(section)
        if node is None:
            continue
        prefix = section[:-1] + "_"  # clocks_event_reason_, clocks_throttle_reason_
        return tuple(
            name
            for name in SLOWDOWNS
            if (node.findtext(prefix + name) or "").strip().lower() == "active"
        )
    return ()


def _recovery(gpu: ET.Element) -> str | None:
    text = (gpu.findtext("gpu_recovery_action") or "").strip()
    return None if text.lower() in _NOT_ASKED or text.startswith("[") else text[:80]


def _broken(gpu: ET.Element) -> str | None:
    """`GPU is lost` or `GPU requires reset`, where the driver printed it for a value. The
    processes' fields are not read: a process's name is its user's choice."""
    for child in gpu:
        if child.tag == "processes":
            continue
        for node in child.iter():
            text = (node.text or "").strip().strip("[]").lower()
            if text in _BROKEN:
                return "GPU is lost" if text == _BROKEN[0] else "GPU requires reset"
    return None


def health_reading(gpu: ET.Element) -> Reading:
    """What one `<gpu>` element says of the GPU's health."""
    return Reading(
        remap_pending=_flag(gpu, "remapped_rows/remapped_row_pending"),
        remap_failure=_flag(gpu, "remapped_rows/remapped_row_failure"),
        remapped_uncorrectable=_count(gpu, "remapped_rows/remapped_row_unc"),
        retire_pending=_either(
            _flag(gpu, "retired_pages/pending_retirement"),
            _flag(gpu, "retired_pages/pending_blacklist"),
        ),
        retired_pages=_sum(
            _count(gpu, "retired_pages/multiple_single_bit_retirement/retired_count"),
            _count(gpu, "retired_pages/double_bit_retirement/retired_count"),
        ),
        ecc_uncorrectable=_ecc(gpu),
        slowdowns=_slowdowns(gpu),
        reset_required=_flag(gpu, "gpu_reset_status/reset_required"),
        recovery_action=_recovery(gpu),
        broken=_broken(gpu),
    )


def _either(*flags: bool | None) -> bool | None:
    """True if any says Yes, False if one says No and none Yes, None if none says."""
    if any(flags):
        return True
    return False if False in flags else None
