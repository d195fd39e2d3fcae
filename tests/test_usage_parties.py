"""The parties the usage store keeps (patroller/state/usage/keys.py): each looked up or made
once, nobody's the row every file has, names cut at a pod name's length, and at most
Config.usage_new_parties made an interval, the others counted under their host account.
In-process and fast: the mutation suite runs this file."""

from __future__ import annotations

import pytest

from patroller.core.pods import NAME_CHARS
from patroller.core.usage import NOBODY, GpuSample, Party
from patroller.state.usage import files
from patroller.state.usage.keys import Keys, cut_party, cut_sample

ALICE = Party(user="alice", account="alice", job="7")
CAROL = Party(user="carol", account="carol", job="8")
EVE = Party(user="eve@lab", account="eve", pod="p")


@pytest.fixture
def db(tmp_path):
    db = files.connect(str(tmp_path / files.FILE), 5.0)
    files.prepare(db)
    yield db
    db.close()


def parties(db):
    return {
        row[0]: Party(*row[1:])
        for row in db.execute(
            "SELECT id, user, account, job, slurm_account, namespace, pod FROM parties"
        )
    }


def test_a_party_is_made_once_and_found_again_after_the_map_is_cleared(db):
    keys = Keys()
    assert keys.party(db, None) is None
    assert keys.party(db, NOBODY) == 0
    alice = keys.party(db, ALICE)
    assert alice is not None and alice != 0
    assert keys.party(db, ALICE) == alice
    carol = keys.party(db, CAROL)
    assert carol not in (None, 0, alice)
    keys.clear()
    assert keys.party(db, ALICE) == alice and keys.party(db, CAROL) == carol
    found = parties(db)
    assert found[alice] == ALICE and found[carol] == CAROL and found[0] == NOBODY
    assert len(found) == 3


def test_past_the_bound_a_party_is_counted_under_its_host_account_once_an_interval(db):
    keys = Keys(new_per_interval=1)
    keys.interval()
    alice = keys.party(db, ALICE)
    over = keys.party(db, EVE)  # the bound reached: eve's host account, made all the same
    assert over not in (None, 0, alice)
    assert parties(db)[over] == Party(user="eve", account="eve")
    assert keys.party(db, EVE) == over
    assert keys.overflow == 1  # the same party again in the interval: counted once
    assert keys.party(db, Party(user="x", job="9")) == 0  # no host account: nobody's
    assert keys.overflow == 2
    keys.interval()  # a new interval: a new bound, and eve is made under her own name
    eve = keys.party(db, EVE)
    assert eve not in (over, alice) and parties(db)[eve] == EVE
    assert keys.overflow == 2


def test_names_are_cut_at_a_pod_names_length_and_a_party_within_it_is_kept_as_it_is(db):
    within = Party(user="u" * NAME_CHARS, account="a", pod="p" * NAME_CHARS)
    assert cut_party(within) is within
    sample = GpuSample(uuid="GPU-a", number=0, seconds=60.0, state="claimed", holder=within)
    assert cut_sample(sample) is sample
    longer = Party(user="u" * (NAME_CHARS + 1), account="a" * (NAME_CHARS + 5))
    assert cut_party(longer) == Party(user="u" * NAME_CHARS, account="a" * NAME_CHARS)
    made = Keys().party(db, longer)
    assert parties(db)[made] == Party(user="u" * NAME_CHARS, account="a" * NAME_CHARS)


def test_the_bound_counts_every_party_made_in_the_interval(db):
    keys = Keys(new_per_interval=2)
    keys.interval()
    alice, carol = keys.party(db, ALICE), keys.party(db, CAROL)
    over = keys.party(db, EVE)
    assert parties(db)[over] == Party(user="eve", account="eve")
    assert keys.overflow == 1 and len({alice, carol, over}) == 3
